// patch_expert (colibri-patch) against the one thing it must equal: converting
// the source checkpoint with that expert replaced. A = the fixture converted;
// D = a donor converted from a copy of the fixture whose expert (1,3) holds
// expert (1,5)'s values and whose expert (0,2) holds (0,6)'s (so a patch that
// took more than one block would show); B = the fixture with only (1,3)
// replaced, converted. patch(A, D, 1, 3) must be B, byte for byte.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "colibri_test_util.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "runtime/session.h"

namespace colibri {
namespace {

using namespace colibri_test;

struct ExpertId {
  std::int32_t layer, expert;
};

// The Hugging Face names of one expert's gate, up and down, from the tensor plan.
std::vector<std::string> expert_tensor_names(const ModelConfig& config, ExpertId id) {
  ModelWeights weights;
  std::vector<std::string> names;
  for (const auto& p : plan_tensors(config, weights, false))
    if (p.role == TensorRole::Expert && p.layer == id.layer && p.expert == id.expert) names.push_back(p.name);
  return names;
}

// Copies a fixture directory and rewrites its model.safetensors with a tiny
// safetensors writer: for each (to, from) pair, expert `to` gets expert
// `from`'s values (same shapes, same dtype, bytes copied).
void write_swapped_checkpoint(const std::filesystem::path& fixture, const std::filesystem::path& out,
                              const std::vector<std::pair<ExpertId, ExpertId>>& swaps) {
  std::filesystem::create_directories(out);
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(fixture / name, out / name, std::filesystem::copy_options::overwrite_existing);
  auto config = load_hf_config(fixture / "config.json");
  ASSERT_TRUE(config.ok()) << config.error().message;
  std::map<std::string, std::string> take_from;
  for (const auto& [to, from] : swaps) {
    auto to_names = expert_tensor_names(*config, to), from_names = expert_tensor_names(*config, from);
    ASSERT_EQ(to_names.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) take_from[to_names[i]] = from_names[i];
  }
  auto file = MappedFile::open(fixture / "model.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tensors = parse_safetensors(file->bytes(), "fixture");
  ASSERT_TRUE(tensors.ok()) << tensors.error().message;
  std::map<std::string, const SafetensorsTensor*> by_name;
  for (const auto& t : *tensors) by_name[t.name] = &t;

  nlohmann::json header = nlohmann::json::object();
  Bytes data;
  for (const auto& t : *tensors) {
    auto source = take_from.count(t.name) ? by_name.at(take_from[t.name]) : &t;
    ASSERT_EQ(source->shape, t.shape);
    ASSERT_EQ(source->dtype, t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + source->bytes.size()}}};
    data.insert(data.end(), source->bytes.begin(), source->bytes.end());
  }
  std::string text = header.dump();
  text.resize(align_up(text.size(), 8), ' ');  // the header is padded to 8 bytes by convention
  Bytes image(8);
  put<std::uint64_t>(image, 0, text.size());
  image.insert(image.end(), text.begin(), text.end());
  image.insert(image.end(), data.begin(), data.end());
  write_bytes(out / "model.safetensors", image);
}

const ColibriExpert& find_block(const ColibriImage& image, std::uint32_t layer, std::uint32_t expert) {
  for (const auto& e : image.experts)
    if (e.layer == layer && e.expert == expert) return e;
  throw std::runtime_error("no such block");
}

std::vector<std::vector<float>> logits_for(const std::filesystem::path& model_path) {
  auto model = Model::load(model_path, LoadOptions{.verify_checksums = true});
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return {};
  std::ifstream in(fixture_dir("mixtral-tiny") / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<std::vector<float>> out;
  for (const auto& prompt : reference["prompts"]) {
    Session session(*model);
    for (std::int32_t token : prompt["tokens"].get<std::vector<std::int32_t>>()) {
      auto logits = session.decode(token);
      EXPECT_TRUE(logits.ok()) << logits.error().message;
      if (!logits.ok()) return out;
      out.emplace_back(logits->begin(), logits->end());
    }
  }
  return out;
}

class ColibriPatch : public ::testing::Test {
 protected:
  // Built once per process (ctest runs each test in its own process, so this
  // is per test there; a plain run of the binary shares it).
  static void SetUpTestSuite() {
    dir_ = new TempDir("patch");
    const auto fixture = fixture_dir("mixtral-tiny");
    write_swapped_checkpoint(fixture, *dir_ / "donor-ckpt", {{{1, 3}, {1, 5}}, {{0, 2}, {0, 6}}});
    write_swapped_checkpoint(fixture, *dir_ / "source-ckpt", {{{1, 3}, {1, 5}}});
    for (auto [checkpoint, output, quant] : {std::tuple{fixture, "A.colibri", "int8"},
                                             std::tuple{*dir_ / "donor-ckpt", "D.colibri", "int8"},
                                             std::tuple{*dir_ / "source-ckpt", "B.colibri", "int8"},
                                             std::tuple{*dir_ / "donor-ckpt", "D4.colibri", "int4"}}) {
      auto status = convert_checkpoint(checkpoint, *dir_ / output, quant);
      ASSERT_TRUE(status.ok()) << status.error().message;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::filesystem::path at(const std::string& name) { return *dir_ / name; }
  static std::filesystem::path copy(const std::string& from, const std::string& to) {
    std::filesystem::copy_file(at(from), at(to), std::filesystem::copy_options::overwrite_existing);
    return at(to);
  }
  static std::string patch_error(const std::filesystem::path& target, const std::filesystem::path& donor,
                                 std::uint32_t layer, std::uint32_t expert, const std::filesystem::path& output) {
    auto report = patch_expert(target, donor, layer, expert, output);
    return report.ok() ? "" : report.error().message;
  }
  static bool no_temp_files() {
    for (const auto& entry : std::filesystem::directory_iterator(dir_->path()))
      if (entry.path().filename().string().find(".tmp-") != std::string::npos) return false;
    return true;
  }

  static TempDir* dir_;
};
TempDir* ColibriPatch::dir_ = nullptr;

TEST_F(ColibriPatch, FixtureSetupIsWhatTheTestsAssume) {
  // D differs from B (it carries a second swapped expert) and B from A.
  EXPECT_NE(read_bytes(at("D.colibri")), read_bytes(at("B.colibri")));
  EXPECT_NE(read_bytes(at("A.colibri")), read_bytes(at("B.colibri")));
  EXPECT_EQ(read_bytes(at("A.colibri")).size(), read_bytes(at("B.colibri")).size());
}

TEST_F(ColibriPatch, PatchedFileEqualsTheConvertedSource) {
  auto report = patch_expert(at("A.colibri"), at("D.colibri"), 1, 3, at("P.colibri"));
  ASSERT_TRUE(report.ok()) << report.error().message;
  const Bytes a = read_bytes(at("A.colibri")), p = read_bytes(at("P.colibri")), b = read_bytes(at("B.colibri")),
              d = read_bytes(at("D.colibri"));
  EXPECT_TRUE(p == b) << "patch(A, D, 1, 3) differs from converting the source with that expert replaced";

  auto pa = parse_colibri(a, "A"), pp = parse_colibri(p, "P"), pd = parse_colibri(d, "D");
  ASSERT_TRUE(pa.ok() && pp.ok() && pd.ok());
  EXPECT_TRUE(verify_colibri_checksums(*pp).empty());
  for (const auto& e : pp->experts) {
    auto new_bytes = pp->expert_bytes(e);
    auto old_bytes = pa->expert_bytes(find_block(*pa, e.layer, e.expert));
    const bool same = std::equal(new_bytes.begin(), new_bytes.end(), old_bytes.begin(), old_bytes.end());
    if (e.layer == 1 && e.expert == 3) {
      EXPECT_FALSE(same);
      auto donor = pd->expert_bytes(find_block(*pd, 1, 3));
      EXPECT_TRUE(std::equal(new_bytes.begin(), new_bytes.end(), donor.begin(), donor.end()));
    } else {
      EXPECT_TRUE(same) << "layer " << e.layer << " expert " << e.expert << " changed";
    }
  }
  // The report: the block's size, and exactly the bytes that differ.
  EXPECT_EQ(report->block_bytes, find_block(*pa, 1, 3).size);
  std::uint64_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differing += a[i] != p[i];
  EXPECT_EQ(report->changed_bytes, differing);
  EXPECT_TRUE(no_temp_files());
}

TEST_F(ColibriPatch, PatchedModelLoadsAndItsLogitsChange) {
  ASSERT_TRUE(patch_expert(at("A.colibri"), at("D.colibri"), 1, 3, at("P.colibri")).ok());
  const auto before = logits_for(at("A.colibri")), after = logits_for(at("P.colibri"));
  ASSERT_EQ(before.size(), after.size());
  ASSERT_FALSE(before.empty());
  std::size_t changed_positions = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    float most = 0.0f;
    for (std::size_t j = 0; j < before[i].size(); ++j) most = std::max(most, std::fabs(before[i][j] - after[i][j]));
    changed_positions += most > 1e-4f;
  }
  EXPECT_GT(changed_positions, 0u) << "expert (1,3) was never routed to: the patch made no difference";
  std::printf("[patch] logits changed at %zu of %zu positions\n", changed_positions, before.size());
}

TEST_F(ColibriPatch, InPlacePatchLeavesAnOldMappingIntact) {
  const auto target = copy("A.colibri", "T.colibri");
  ::chmod(target.c_str(), 0640);
  auto old_map = MappedFile::open(target);
  ASSERT_TRUE(old_map.ok());
  auto old_image = parse_colibri(old_map->bytes(), "T (old mapping)");
  ASSERT_TRUE(old_image.ok());
  const auto old_block = old_image->expert_bytes(find_block(*old_image, 1, 3));
  const Bytes saved(old_block.begin(), old_block.end());

  auto report = patch_expert(target, at("D.colibri"), 1, 3, target);
  ASSERT_TRUE(report.ok()) << report.error().message;
  // The rename replaced the name; the old inode, still mapped, is untouched.
  EXPECT_TRUE(std::equal(old_block.begin(), old_block.end(), saved.begin(), saved.end()));
  EXPECT_TRUE(verify_colibri_checksums(*old_image).empty());
  EXPECT_TRUE(read_bytes(target) == read_bytes(at("B.colibri")));
  EXPECT_EQ(std::filesystem::status(target).permissions() & std::filesystem::perms::mask,
            std::filesystem::perms(0640)) << "an in-place patch keeps the file's permissions";
  EXPECT_TRUE(no_temp_files());
}

TEST_F(ColibriPatch, DonorWithAnotherQuantizationIsRefused) {
  const std::string error = patch_error(at("A.colibri"), at("D4.colibri"), 1, 3, at("X-quant.colibri"));
  EXPECT_NE(error.find("layer 1 expert 3: tensor 'model.layers.1.block_sparse_moe.experts.3.w1.weight' differs "
                       "in layout: q8"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("but q4"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(at("X-quant.colibri")));
  EXPECT_TRUE(no_temp_files());
}

TEST_F(ColibriPatch, MissingLayerOrExpertIsRefused) {
  std::string error = patch_error(at("A.colibri"), at("D.colibri"), 2, 3, at("X-missing.colibri"));
  EXPECT_NE(error.find("has no block for layer 2 expert 3 (its blocks are layers 0-1, experts 0-7)"),
            std::string::npos)
      << error;
  error = patch_error(at("A.colibri"), at("D.colibri"), 0, 8, at("X-missing.colibri"));
  EXPECT_NE(error.find("has no block for layer 0 expert 8"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(at("X-missing.colibri")));
}

TEST_F(ColibriPatch, UnreadableOrMalformedFilesAreRefused) {
  std::string error = patch_error(at("missing.colibri"), at("D.colibri"), 1, 3, at("X-unreadable.colibri"));
  EXPECT_NE(error.find("missing.colibri: cannot open"), std::string::npos) << error;
  error = patch_error(at("A.colibri"), at("missing.colibri"), 1, 3, at("X-unreadable.colibri"));
  EXPECT_NE(error.find("missing.colibri: cannot open"), std::string::npos) << error;
  Bytes broken = read_bytes(at("D.colibri"));
  broken.resize(1000);
  write_bytes(at("broken.colibri"), broken);
  error = patch_error(at("A.colibri"), at("broken.colibri"), 1, 3, at("X-unreadable.colibri"));
  EXPECT_NE(error.find("broken.colibri: truncated"), std::string::npos) << error;
  error = patch_error(at("A.colibri"), at("D.colibri"), 1, 3, at("no-such-dir") / "X-unreadable.colibri");
  EXPECT_NE(error.find("cannot create"), std::string::npos) << error;
}

TEST_F(ColibriPatch, CorruptDonorBlockIsRefused) {
  // A damaged donor block must not be copied in with freshly computed checksums.
  Bytes donor = read_bytes(at("D.colibri"));
  auto image = parse_colibri(donor, "D");
  ASSERT_TRUE(image.ok());
  const std::uint64_t at_byte = image->header.data_offset + find_block(*image, 1, 3).offset + 5;
  donor[at_byte] ^= 0x10;
  write_bytes(at("Dbad.colibri"), donor);
  const std::string error = patch_error(at("A.colibri"), at("Dbad.colibri"), 1, 3, at("X-corrupt.colibri"));
  EXPECT_NE(error.find("Dbad.colibri: the block of layer 1 expert 3 fails its checksum"), std::string::npos)
      << error;
  EXPECT_FALSE(std::filesystem::exists(at("X-corrupt.colibri")));
  // A damaged block elsewhere in the donor does not matter.
  donor[at_byte] ^= 0x10;
  donor[image->header.data_offset + find_block(*image, 0, 0).offset + 5] ^= 0x10;
  write_bytes(at("Dother.colibri"), donor);
  EXPECT_EQ(patch_error(at("A.colibri"), at("Dother.colibri"), 1, 3, at("X-corrupt.colibri")), "");
  EXPECT_TRUE(read_bytes(at("X-corrupt.colibri")) == read_bytes(at("B.colibri")));
}

TEST_F(ColibriPatch, DonorOfAnotherArchitectureIsRefused) {
  ASSERT_TRUE(convert_checkpoint(fixture_dir("qwen2moe-tiny"), at("Q.colibri"), "int8").ok());
  const std::string error = patch_error(at("A.colibri"), at("Q.colibri"), 0, 0, at("X-arch.colibri"));
  EXPECT_NE(error.find("Q.colibri has no tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' (is it the "
                       "same architecture?)"),
            std::string::npos)
      << error;
  EXPECT_FALSE(std::filesystem::exists(at("X-arch.colibri")));
}

TEST_F(ColibriPatch, PatchingAFileWithItselfChangesNothing) {
  const auto target = copy("A.colibri", "Self.colibri");
  auto report = patch_expert(target, target, 0, 0, target);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_EQ(report->changed_bytes, 0u);
  EXPECT_TRUE(read_bytes(target) == read_bytes(at("A.colibri")));
}

}  // namespace
}  // namespace colibri
