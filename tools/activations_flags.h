// --prefill-activations and --decode-activations, shared by the tools that
// run a session: how a prompt's and a generated token's products are
// multiplied (Session::set_prefill_activation_modes and set_activation_modes;
// the server's prefill_activations and decode_activations).
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace colibri_tools {

// 'same', then the names colibri::activation_preset() knows.
inline const std::vector<std::string> kActivationModeNames = {"same", "int8-ffn", "int8-ffn-out"};

struct PrefillActivationsFlag {
  std::string name = "int8-ffn-out";

  void add(CLI::App& app) {
    app.add_option("--prefill-activations", name,
                   "How the prompt's tokens are multiplied (8-bit weights): 'int8-ffn-out', one int8 "
                   "activation plane for the attention output and the FFN gate and up products and two for "
                   "the rest (Session's default kPrefillInt8FfnOut: a prompt is bound by arithmetic; fidelity "
                   "within the int8 bounds, docs/KERNELS.md); 'int8-ffn', one plane for gate and up only; or "
                   "'same' as generated tokens, so the prompt's logits are bit-identical to decoding it token "
                   "by token. The server's prefill_activations.")
        ->capture_default_str()
        ->check(CLI::IsMember(kActivationModeNames));
  }

  // 'same': prefill in the session's own (decode) modes, whichever they are.
  void apply(colibri::Session& session) const {
    session.set_prefill_activation_modes(colibri::activation_preset(name));
  }
};

struct DecodeActivationsFlag {
  std::string name = "same";

  void add(CLI::App& app) {
    app.add_option("--decode-activations", name,
                   "How generated tokens are multiplied (8-bit weights): 'same' (the default: an int8 activation "
                   "plane with a residual plane, outputs equal to the server's defaults), 'int8-ffn' (one plane "
                   "for the FFN gate and up products) or 'int8-ffn-out' (and the attention output): faster "
                   "where decode is arithmetic-bound (many sessions at once; a lone stream reads the same "
                   "bytes and gained nothing measurable on the hosts measured), fidelity within the int8 "
                   "bounds. The server's decode_activations.")
        ->capture_default_str()
        ->check(CLI::IsMember(kActivationModeNames));
  }

  void apply(colibri::Session& session) const {
    if (const auto modes = colibri::activation_preset(name)) session.set_activation_modes(*modes);
  }
};

}  // namespace colibri_tools
