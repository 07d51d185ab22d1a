# Generates the instruction wrappers of include/flashinfer/wgmma.cuh (their asm operand lists are long):
#   python3 scripts/gen_wgmma.py  -> the text between "struct Wgmma;" and the closing namespaces.
def ops(n, start=0):
    return ", ".join(f"%{i}" for i in range(start, start + n))


def outs(n):
    return ", ".join(f'"+f"(d[{i}])' for i in range(n))


def wrapper(n, ptx, a_regs, tn=False):
    """ss (A, B by descriptors, both K-major), ss_tn (the same, B transposed) or rs_tn (A from
    registers, B transposed)."""
    r = n // 2
    if not a_regs and tn:
        name, params, a_ops = "ss_tn", "uint64_t desc_a, uint64_t desc_b", f"%{r}, %{r + 1}"
        ins, pred, tail = '"l"(desc_a), "l"(desc_b)', r + 2, "1, 1, 0, 1"
        doc = (f"  // d (+)= A B: A [64 x 16] by a K-major descriptor, B [16 x {n}] by an MN-major one\n"
               f"  // (transposed by the instruction).\n")
    elif a_regs:
        name, params, a_ops = "rs_tn", "const uint32_t* a, uint64_t desc_b", f"{{{ops(4, r)}}}, %{r + 4}"
        ins, pred, tail = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)', r + 5, "1, 1, 1"
        doc = (f"  // d (+)= A B: A [64 x 16] from registers (the m16n8k16 A layout per warp), B [16 x {n}] by a\n"
               f"  // descriptor, MN-major (transposed by the instruction).\n")
    else:
        name, params, a_ops = "ss", "uint64_t desc_a, uint64_t desc_b", f"%{r}, %{r + 1}"
        ins, pred, tail = '"l"(desc_a), "l"(desc_b)', r + 2, "1, 1, 0, 0"
        doc = f"  // d (+)= A B: A [64 x 16] and B [16 x {n}] by shared-memory descriptors, both K-major.\n"
    return f"""{doc}  static FLASHINFER_DEVICE void {name}(float* d, {params}, int accumulate) {{
#if FLASHINFER_WGMMA_ARCH
    asm volatile(
        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pred}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{ops(r)}}}, {a_ops}, p, {tail};\\n}}\\n"
        : {outs(r)}
        : {ins}, "r"(accumulate));
#else
    wgmma_unavailable();
#endif
  }}
"""


body = []
for tname, ptx in (("__half", "f16"), ("__nv_bfloat16", "bf16")):
    # S = Q K^T: 64 keys, 128 (warp-specialized CTAs) or 32 (MLA's split scores) (ss); P V: N =
    # the V / O columns, P from registers (rs_tn) or (MLA) from shared memory (ss_tn)
    for n in (32, 64, 128, 256):
        fns = [wrapper(n, ptx, False)] if n <= 128 else []
        fns += [wrapper(n, ptx, False, tn=True)] if n >= 128 else []
        fns += [wrapper(n, ptx, True)] if n >= 64 else []
        body.append(f"template <>\nstruct Wgmma<{tname}, {n}> {{\n" + "".join(fns) + "};\n")
print("\n".join(body), end="")
