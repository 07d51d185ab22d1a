# Build switches, one per axis, each with a small default. pyproject.toml forwards the
# environment variables of the same names, so pip, CI and scripts/ use one knob.

# SM targets, e.g. "8.0 9.0a" (spaces or semicolons). Empty: the local GPU when
# nvidia-smi finds one, otherwise FLASHINFER_DEFAULT_ARCHS.
set(FLASHINFER_CUDA_ARCH_LIST "" CACHE STRING "CUDA compute capabilities to build, e.g. '8.0 9.0a'")
set(FLASHINFER_DEFAULT_ARCHS "8.0;9.0" CACHE STRING "SM targets used when none is given and no GPU is found")
# Element types instantiated for the kernel families (f16, bf16).
set(FLASHINFER_DTYPES "f16;bf16" CACHE STRING "Element types to instantiate: f16;bf16")
option(FLASHINFER_PTXAS_VERBOSE "Print ptxas register/spill reports" OFF)

function(flashinfer_resolve_archs out_var)
  set(archs "${FLASHINFER_CUDA_ARCH_LIST}")
  if(archs STREQUAL "")
    execute_process(COMMAND nvidia-smi --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE smi RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND NOT smi STREQUAL "")
      string(REPLACE "\n" ";" smi "${smi}")
      list(REMOVE_DUPLICATES smi)
      set(archs "${smi}")
      message(STATUS "flashinfer: building for the local GPU(s): ${archs}")
    else()
      set(archs "${FLASHINFER_DEFAULT_ARCHS}")
      message(STATUS "flashinfer: no GPU found; building for the default list: ${archs}")
    endif()
  endif()
  string(REPLACE " " ";" archs "${archs}")
  set(result "")
  foreach(a IN LISTS archs)
    if(a STREQUAL "")
      continue()
    endif()
    string(REPLACE "." "" a "${a}")  # 9.0a -> 90a
    list(APPEND result "${a}")
  endforeach()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# A kernel library with an sm_90a path (wgmma): where 9.0 is a target, build sm_90a code for
# it (9.0 devices run it) next to compute_90 PTX, and define FLASHINFER_ENABLE_WGMMA so the
# launchers may pick that path on 9.0 devices.
function(flashinfer_enable_wgmma target)
  get_target_property(archs ${target} CUDA_ARCHITECTURES)
  set(out "")
  set(found FALSE)
  foreach(a IN LISTS archs)
    if(a STREQUAL "90")
      list(APPEND out "90a-real" "90-virtual")
      set(found TRUE)
    elseif(a MATCHES "^90a")
      list(APPEND out "${a}")
      set(found TRUE)
    else()
      list(APPEND out "${a}")
    endif()
  endforeach()
  if(found)
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${out}")
    target_compile_definitions(${target} PRIVATE FLASHINFER_ENABLE_WGMMA)
    message(STATUS "flashinfer: ${target}: wgmma path on (CUDA architectures ${out})")
  endif()
endfunction()
