// What host-side planners need to know about a device, passed in as an argument so the
// planners stay pure C++ (testable on the CPU). utils.cuh's query_device_info() fills it.
#pragma once

namespace flashinfer {

struct DeviceInfo {
  int num_sms = 132;
  int smem_optin = 227 * 1024;     // max dynamic shared memory per block after opt-in, bytes
  int smem_per_sm = 228 * 1024;    // shared memory per SM, bytes
  int max_threads_per_sm = 2048;
  int regs_per_sm = 65536;
  int cc_major = 9;
  int cc_minor = 0;

  bool supports_pdl() const { return cc_major >= 9; }
};

}  // namespace flashinfer
