// A small validator for the Prometheus text exposition format (0.0.4), enough
// to prove /metrics parses: comment lines, metric and label name syntax, label
// value escapes, sample values, TYPE before samples, and histogram invariants
// (cumulative buckets, +Inf bucket == _count).
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace colibri::test {

struct PrometheusSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

inline bool metric_name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

inline bool parse_value(const std::string& text, double& value) {
  if (text == "+Inf") return value = INFINITY, true;
  if (text == "-Inf") return value = -INFINITY, true;
  if (text == "NaN") return value = NAN, true;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size();
}

// Returns "" when valid, else the first problem with its line. Samples are
// appended to `samples` when given.
inline std::string check_prometheus_text(const std::string& text, std::vector<PrometheusSample>* samples = nullptr) {
  std::istringstream lines(text);
  std::string line;
  std::map<std::string, std::string> types;
  std::set<std::string> seen_samples_of;
  std::map<std::string, double> last_bucket, inf_bucket, count;
  int number = 0;
  if (!text.empty() && text.back() != '\n') return "the text does not end with a newline";
  while (std::getline(lines, line)) {
    ++number;
    const std::string where = " (line " + std::to_string(number) + ": " + line + ")";
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream words(line);
      std::string hash, kind, name, rest;
      words >> hash >> kind >> name;
      if (kind == "TYPE") {
        words >> rest;
        if (rest != "counter" && rest != "gauge" && rest != "histogram" && rest != "summary" && rest != "untyped")
          return "unknown TYPE" + where;
        if (types.count(name)) return "TYPE given twice" + where;
        if (seen_samples_of.count(name)) return "TYPE after samples" + where;
        types[name] = rest;
      }
      continue;
    }
    PrometheusSample sample;
    std::size_t i = 0;
    if (!metric_name_char(line[0], true)) return "bad metric name" + where;
    while (i < line.size() && metric_name_char(line[i], i == 0)) sample.name += line[i++];
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::string label;
        while (i < line.size() && (metric_name_char(line[i], label.empty()) && line[i] != ':')) label += line[i++];
        if (label.empty() || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') return "bad label" + where;
        i += 2;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\') {
            if (i + 1 >= line.size()) return "bad escape" + where;
            const char e = line[i + 1];
            if (e == 'n') value += '\n';
            else if (e == '\\' || e == '"') value += e;
            else return "bad escape" + where;
            i += 2;
          } else {
            value += line[i++];
          }
        }
        if (i >= line.size()) return "unterminated label value" + where;
        ++i;
        sample.labels[label] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return "unterminated labels" + where;
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') return "no space before the value" + where;
    std::string value_text = line.substr(i + 1);
    if (auto space = value_text.find(' '); space != std::string::npos) value_text.resize(space);  // timestamp
    if (!parse_value(value_text, sample.value)) return "bad value" + where;

    std::string family = sample.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (family.size() > s.size() && family.compare(family.size() - s.size(), s.size(), s) == 0 &&
          types.count(family.substr(0, family.size() - s.size())) &&
          types[family.substr(0, family.size() - s.size())] == "histogram") {
        family.resize(family.size() - s.size());
        break;
      }
    }
    if (!types.count(family)) return "sample without a TYPE" + where;
    seen_samples_of.insert(family);
    if (types[family] == "counter" && (sample.value < 0 || std::isnan(sample.value))) return "negative counter" + where;
    if (types[family] == "histogram") {
      if (sample.name == family + "_bucket") {
        if (!sample.labels.count("le")) return "bucket without le" + where;
        if (sample.value < last_bucket[family]) return "buckets not cumulative" + where;
        last_bucket[family] = sample.value;
        if (sample.labels["le"] == "+Inf") inf_bucket[family] = sample.value;
      } else if (sample.name == family + "_count") {
        count[family] = sample.value;
      }
    }
    if (samples) samples->push_back(std::move(sample));
  }
  for (const auto& [family, type] : types) {
    if (type != "histogram") continue;
    if (!inf_bucket.count(family) || !count.count(family)) return "histogram " + family + " lacks +Inf or _count";
    if (inf_bucket[family] != count[family]) return "histogram " + family + ": +Inf bucket != _count";
  }
  return "";
}

}  // namespace colibri::test
