// A strict reader of JSON text, enough to check what `fa3 bench --json` writes: any
// syntax error, or anything after the value, makes the whole text invalid.
#pragma once

#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fa3::test {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in file order

  const JsonValue* find(const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  std::optional<JsonValue> read_document() {
    JsonValue v;
    if (!value(v)) return std::nullopt;
    skip_space();
    if (pos_ != text_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && std::string_view(" \n\r\t").find(text_[pos_]) != std::string_view::npos) ++pos_;
  }
  bool take(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool word(std::string_view w) {
    if (text_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  bool value(JsonValue& v) {
    skip_space();
    if (pos_ >= text_.size()) return false;
    const char c = text_[pos_];
    if (c == '{') return object(v);
    if (c == '[') return array(v);
    if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      return string(v.string);
    }
    if (word("true") || word("false")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = c == 't';
      return true;
    }
    if (word("null")) {
      v.kind = JsonValue::Kind::kNull;
      return true;
    }
    return number(v);
  }

  bool object(JsonValue& v) {
    v.kind = JsonValue::Kind::kObject;
    ++pos_;
    if (take('}')) return true;
    do {
      std::string key;
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"' || !string(key) || !take(':')) return false;
      JsonValue member;
      if (!value(member)) return false;
      v.object.emplace_back(std::move(key), std::move(member));
    } while (take(','));
    return take('}');
  }

  bool array(JsonValue& v) {
    v.kind = JsonValue::Kind::kArray;
    ++pos_;
    if (take(']')) return true;
    do {
      JsonValue element;
      if (!value(element)) return false;
      v.array.push_back(std::move(element));
    } while (take(','));
    return take(']');
  }

  bool string(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) return false;
      const char e = text_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u':
          for (int i = 0; i < 4; ++i) {
            if (pos_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[pos_++]))) return false;
          }
          out += '?';  // the checks never look inside escaped characters
          break;
        default: return false;
      }
    }
    return false;
  }

  // JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number(JsonValue& v) {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      return pos_ > from;
    };
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      return false;
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digits()) return false;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) return false;
    }
    v.kind = JsonValue::Kind::kNumber;
    auto [ptr, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, v.number);
    return ec == std::errc() && ptr == text_.data() + pos_;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

inline std::optional<JsonValue> parse_json(std::string_view text) { return JsonReader(text).read_document(); }

}  // namespace fa3::test
