#include "format/safetensors.h"

#include "core/text_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace colibri {
namespace {

// A header larger than this is not a real checkpoint (the safetensors library
// uses the same cap); refusing early keeps a hostile length from costing memory.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr std::size_t kMaxRank = 8;

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

Result<SafetensorsTensor> parse_entry(const std::string& name, const nlohmann::json& entry,
                                      std::span<const std::uint8_t> data, std::string_view source,
                                      std::uint64_t* begin_out, std::uint64_t* end_out) {
  if (!entry.is_object()) return make_error("{}: tensor '{}': entry is not a JSON object", source, name);
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    return make_error("{}: tensor '{}': missing or non-string 'dtype'", source, name);
  if (shape_it == entry.end() || !shape_it->is_array())
    return make_error("{}: tensor '{}': missing or non-array 'shape'", source, name);
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
    return make_error("{}: tensor '{}': 'data_offsets' must be an array of two integers", source, name);

  SafetensorsTensor tensor;
  tensor.name = name;
  tensor.source = std::string(source);
  std::string dtype_text = dtype_it->get<std::string>();
  auto dtype = dtype_from_safetensors(dtype_text);
  if (!dtype)
    return make_error("{}: tensor '{}': unsupported dtype '{}' (supported: F32, F16, BF16)", source,
                      name, dtype_text);
  tensor.dtype = *dtype;

  if (shape_it->size() > kMaxRank)
    return make_error("{}: tensor '{}': rank {} exceeds the maximum of {}", source, name,
                      shape_it->size(), kMaxRank);
  std::uint64_t count = 1;
  for (const auto& dim : *shape_it) {
    if (!dim.is_number_unsigned())
      return make_error("{}: tensor '{}': shape has a non-integer or negative dimension {}", source,
                        name, dim.dump());
    std::uint64_t d = dim.get<std::uint64_t>();
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        !checked_mul(count, d, &count))
      return make_error("{}: tensor '{}': shape {} overflows 64 bits", source, name, shape_it->dump());
    tensor.shape.push_back(static_cast<std::int64_t>(d));
  }
  tensor.element_count = count;
  std::uint64_t nbytes = 0;
  if (!checked_mul(count, dtype_size(tensor.dtype), &nbytes))
    return make_error("{}: tensor '{}': byte size of shape {} overflows 64 bits", source, name,
                      shape_it->dump());

  const auto& lo = (*offsets_it)[0];
  const auto& hi = (*offsets_it)[1];
  if (!lo.is_number_unsigned() || !hi.is_number_unsigned())
    return make_error("{}: tensor '{}': data_offsets must be non-negative integers, got {}", source,
                      name, offsets_it->dump());
  std::uint64_t begin = lo.get<std::uint64_t>();
  std::uint64_t end = hi.get<std::uint64_t>();
  if (begin > end)
    return make_error("{}: tensor '{}': data_offsets [{}, {}] end before they begin", source, name,
                      begin, end);
  if (end > data.size())
    return make_error("{}: tensor '{}': data_offsets [{}, {}] run past the data section of {} bytes",
                      source, name, begin, end, data.size());
  if (end - begin != nbytes)
    return make_error("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets span {}",
                      source, name, shape_it->dump(), dtype_text, nbytes, end - begin);
  tensor.bytes = data.subspan(begin, end - begin);
  *begin_out = begin;
  *end_out = end;
  return tensor;
}

}  // namespace

Result<std::vector<SafetensorsTensor>> parse_safetensors(std::span<const std::uint8_t> image,
                                                         std::string_view source) {
  if (image.size() < 8)
    return make_error("{}: truncated: {} bytes, a safetensors file starts with an 8-byte header length",
                      source, image.size());
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | image[static_cast<std::size_t>(i)];
  if (header_len > kMaxHeaderBytes)
    return make_error("{}: header length {} exceeds the {}-byte limit", source, header_len,
                      kMaxHeaderBytes);
  if (header_len > image.size() - 8)
    return make_error("{}: header length {} runs past the end of the file ({} bytes)", source,
                      header_len, image.size());

  auto header_text = std::string_view(reinterpret_cast<const char*>(image.data()) + 8, header_len);
  // The format: the header starts with '{' (a JSON parser would skip leading
  // whitespace; two readers must not disagree on where a header begins).
  if (header_text.empty() || header_text.front() != '{')
    return make_error("{}: header does not start with '{{'", source);
  // JSON parsers keep one of two equal keys silently, so a header naming a
  // tensor twice would load whichever entry this parser keeps; such a file
  // is refused instead (the safetensors format forbids it).
  std::vector<std::set<std::string>> keys_seen;
  std::string duplicate;
  auto watch_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) keys_seen.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !keys_seen.empty()) keys_seen.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !keys_seen.empty() && duplicate.empty() &&
        !keys_seen.back().insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(header_text, watch_keys, /*allow_exceptions=*/false);
  if (header.is_discarded()) return make_error("{}: header is not valid JSON", source);
  if (!duplicate.empty()) return make_error("{}: header names '{}' twice", source, duplicate.substr(0, 256));
  if (!header.is_object()) return make_error("{}: header is not a JSON object", source);

  auto data = image.subspan(8 + header_len);
  struct Extent {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<SafetensorsTensor> tensors;
  std::vector<Extent> extents;
  tensors.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    std::uint64_t begin = 0, end = 0;
    auto tensor = parse_entry(name, entry, data, source, &begin, &end);
    if (!tensor) return tensor.error();
    extents.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(tensor).value());
  }

  // Tensors must tile the data section exactly: sorted by offset, each begins
  // where the previous ended and the last ends at the end of the file.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    const std::string& name = tensors[e.index].name;
    if (e.begin < cursor) {
      const std::string& previous = tensors[extents[i - 1].index].name;
      return make_error("{}: tensor '{}' at [{}, {}] overlaps tensor '{}' ending at {}", source, name,
                        e.begin, e.end, previous, cursor);
    }
    if (e.begin > cursor)
      return make_error("{}: {} unused bytes before tensor '{}' at offset {} (hole in data section)",
                        source, e.begin - cursor, name, e.begin);
    cursor = e.end;
  }
  if (cursor != data.size())
    return make_error("{}: data section is {} bytes but tensors cover only {}", source, data.size(),
                      cursor);
  return tensors;
}

namespace {

Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  auto text = read_text_file(path);
  if (!text) return text.error();
  nlohmann::json json = nlohmann::json::parse(*text, nullptr, false);
  if (json.is_discarded()) return make_error("{}: not valid JSON", path.string());
  return json;
}

// Shard names come from a file we do not trust: each must name a file directly
// inside the model directory, never one reached through '..' or '/'. Symlinks
// placed in the directory by the user are followed (the Hugging Face cache
// links every file of a snapshot to a blob outside it).
Result<std::filesystem::path> resolve_shard(const std::filesystem::path& dir,
                                            const std::string& shard,
                                            const std::filesystem::path& index_path) {
  std::filesystem::path relative(shard);
  if (shard.empty() || shard == "." || shard == ".." || relative.is_absolute() ||
      relative.has_parent_path() || shard.find('\\') != std::string::npos)
    return make_error("{}: shard path '{}' escapes the model directory", index_path.string(), shard);
  return dir / relative;
}

}  // namespace

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::filesystem::path& model_dir) {
  SafetensorsCheckpoint checkpoint;
  checkpoint.directory_ = model_dir;

  std::vector<std::filesystem::path> shard_paths;
  std::unordered_map<std::string, std::string> expected_shard;  // tensor -> shard, from the index
  auto index_path = model_dir / "model.safetensors.index.json";
  auto single_path = model_dir / "model.safetensors";
  // Whether a path names something, without throwing: a symlink loop or an
  // unreadable directory is an error that names the path (the throwing
  // exists() ended the process).
  auto present = [](const std::filesystem::path& path) -> Result<bool> {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      return make_error("{}: cannot be read: {}", path.string(), ec.message());
    return std::filesystem::exists(status);
  };
  auto has_index = present(index_path);
  if (!has_index) return has_index.error();
  auto has_single = present(single_path);
  if (!has_single) return has_single.error();
  if (*has_index) {
    auto index = read_json_file(index_path);
    if (!index) return index.error();
    auto map_it = index->find("weight_map");
    if (map_it == index->end() || !map_it->is_object())
      return make_error("{}: missing 'weight_map' object", index_path.string());
    std::vector<std::string> shard_names;
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string())
        return make_error("{}: weight_map entry '{}' is not a file name", index_path.string(), tensor);
      auto name = shard.get<std::string>();
      expected_shard[tensor] = name;
      if (std::find(shard_names.begin(), shard_names.end(), name) == shard_names.end())
        shard_names.push_back(name);
    }
    for (const auto& name : shard_names) {
      auto path = resolve_shard(model_dir, name, index_path);
      if (!path) return path.error();
      shard_paths.push_back(*path);
    }
  } else if (*has_single) {
    shard_paths.push_back(single_path);
  } else {
    return make_error("{}: no model.safetensors or model.safetensors.index.json", model_dir.string());
  }

  for (const auto& path : shard_paths) {
    auto file = MappedFile::open(path);
    if (!file) return file.error();
    auto parsed = parse_safetensors(file->bytes(), path.string());
    if (!parsed) return parsed.error();
    for (auto& tensor : *parsed) {
      if (checkpoint.by_name_.count(tensor.name))
        return make_error("{}: tensor '{}' also appears in {}", path.string(), tensor.name,
                          checkpoint.tensors_[checkpoint.by_name_[tensor.name]].source);
      if (!expected_shard.empty()) {
        auto it = expected_shard.find(tensor.name);
        if (it == expected_shard.end() || it->second != path.filename().string())
          return make_error("{}: tensor '{}' is not listed for this shard in the index", path.string(),
                            tensor.name);
      }
      checkpoint.by_name_[tensor.name] = checkpoint.tensors_.size();
      checkpoint.tensors_.push_back(std::move(tensor));
    }
    checkpoint.files_.push_back(std::move(file).value());
  }
  for (const auto& [tensor, shard] : expected_shard) {
    if (!checkpoint.by_name_.count(tensor))
      return make_error("{}: index lists tensor '{}' in '{}' but that shard does not contain it",
                        index_path.string(), tensor, shard);
  }
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace colibri
