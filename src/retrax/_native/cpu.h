// What the CPU running the process can execute, for retrax's kernels.
#ifndef RETRAX_NATIVE_CPU_H_
#define RETRAX_NATIVE_CPU_H_

namespace retrax {

#if defined(__x86_64__) && defined(__GNUC__)
// Whether the CPU has AVX2 and FMA. The kernels' vectorised loops are
// compiled for them with target attributes and chosen here, once per process,
// so one library runs on any x86-64 CPU and uses the wide loops where it can.
inline bool HasAvx2Fma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

}  // namespace retrax

#endif  // RETRAX_NATIVE_CPU_H_
