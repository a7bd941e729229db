// The kernel checks of kernel_checks.h as a plain program, for targets
// without GoogleTest: tests/scripts/neon_qemu.sh cross-compiles it for
// aarch64 and runs it under qemu. Runs every path this CPU supports and exits
// non-zero on any failure. Usage: kernel_checks [cases per check]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernel_checks.h"

int main(int argc, char** argv) {
  using namespace colibri::kernels;
  const int cases = argc > 1 ? std::atoi(argv[1]) : 24;
  if (cases <= 0) {
    std::fprintf(stderr, "usage: %s [cases per check, > 0]\n", argv[0]);
    return 2;
  }
  int failures = 0;
  for (Isa isa : supported_isas()) {
    if (!force_isa(isa)) {
      std::fprintf(stderr, "cannot select the %s path\n", std::string(isa_name(isa)).c_str());
      return 1;
    }
    const int matvec = checks::check_matvec_matches_reference(cases);
    const int matmat = checks::check_matmat_matches_matvec(cases);
    const int wide = checks::check_matmat_matches_matvec(std::max(1, cases / 20), 77, /*wide=*/true);
    const int attention = checks::check_attention_matches_reference(cases * 4);
    const int f16 = checks::check_f16_conversion();
    const int q8r16 = checks::check_r16_matches_portable(colibri::WeightFormat::Q8R16, cases);
    const int q4r16 = checks::check_r16_matches_portable(colibri::WeightFormat::Q4R16, cases);
    const int mixed = checks::check_mixed_batches_match_matvec(cases);
    auto verdict = [](int n) { return n == 0 ? std::string("ok") : std::to_string(n) + " failures"; };
    std::printf("%-7s matvec ~ reference: %s, matmat == matvec: %s (wide rows: %s), attention (f32, f16 cache) ~ reference: %s, "
                "f32 -> f16: %s, q8r16 == portable: %s, q4r16 == portable: %s, mixed batches: %s\n",
                std::string(isa_name(isa)).c_str(), verdict(matvec).c_str(), verdict(matmat).c_str(), verdict(wide).c_str(),
                verdict(attention).c_str(), verdict(f16).c_str(), verdict(q8r16).c_str(), verdict(q4r16).c_str(),
                verdict(mixed).c_str());
    failures += matvec + matmat + wide + attention + f16 + q8r16 + q4r16 + mixed;
  }
  return failures == 0 ? 0 : 1;
}
