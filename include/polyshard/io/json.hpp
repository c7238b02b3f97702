// A small strict JSON parser for file headers we do not trust: objects, arrays, strings with
// escapes and integers; anything else, and any malformed byte, is an error with its position.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"

namespace polyshard {

struct JsonMember;

/// A parsed JSON value. Tensor-file headers use objects, arrays, strings and integers only; the
/// whole grammar (fractions, true, false, null) is parsed on request, for configuration files.
/// Objects keep their members in file order and never hold two members of one name (the parser
/// rejects duplicates).
struct JsonValue {
  enum class Kind { Object, Array, String, Integer, Number, Boolean, Null };
  Kind kind = Kind::Object;
  std::vector<JsonMember> members;  ///< Kind::Object
  std::vector<JsonValue> elements;  ///< Kind::Array
  std::string string;               ///< Kind::String (UTF-8)
  std::int64_t integer = 0;         ///< Kind::Integer
  double number = 0;                ///< Kind::Number (a fraction or an exponent was written)
  bool boolean = false;             ///< Kind::Boolean

  /// The member named `key`, or nullptr (objects only).
  const JsonValue* find(std::string_view key) const;
};

/// One member of a JSON object.
struct JsonMember {
  std::string name;
  JsonValue value;
};

inline const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [name, value] : members)
    if (name == key) return &value;
  return nullptr;
}

/// Name of a JSON kind, for error messages ("expected an array, found a string").
inline const char* json_kind_name(JsonValue::Kind k) {
  switch (k) {
    case JsonValue::Kind::Object: return "an object";
    case JsonValue::Kind::Array: return "an array";
    case JsonValue::Kind::String: return "a string";
    case JsonValue::Kind::Integer: return "an integer";
    case JsonValue::Kind::Number: return "a number";
    case JsonValue::Kind::Boolean: return "a boolean";
    case JsonValue::Kind::Null: return "null";
  }
  return "a value";
}

namespace detail {

/// Recursive-descent parser. Recursion is bounded by `max_depth`, so a hostile "[[[[..." cannot
/// exhaust the stack; every read is bounds-checked against the text.
class JsonParser {
 public:
  JsonParser(std::string_view text, int max_depth, std::size_t max_array, std::size_t max_values,
             bool whole_grammar = false)
      : text_(text), max_depth_(max_depth), max_array_(max_array), max_values_(max_values),
        whole_grammar_(whole_grammar) {}

  JsonValue parse_document() {
    skip_whitespace();
    JsonValue v = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected '", printable(text_[pos_]), "' after the end of the JSON value");
    return v;
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    detail::throw_error("invalid JSON at byte ", pos_, ": ", parts...);
  }

  static std::string printable(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string(1, c);
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("\\x") + hex[u >> 4] + hex[u & 15];
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect(char c) {
    if (at_end()) fail("expected '", c, "' but the text ended");
    if (peek() != c) fail("expected '", c, "' but found '", printable(peek()), "'");
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth > max_depth_) fail("values nested deeper than ", max_depth_, " levels");
    // Each value costs a JsonValue (about 100 bytes) however short its text ("[]," is 3 bytes):
    // bound the count so that a hostile 100 MB header cannot make the tree take gigabytes.
    if (++values_ > max_values_) fail("more than ", max_values_, " values");
    if (at_end()) fail("expected a value but the text ended");
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      JsonValue v;
      v.kind = JsonValue::Kind::String;
      v.string = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_integer();
    if (c == 't' || c == 'f' || c == 'n') {
      if (!whole_grammar_) fail("true, false and null are not expected here (only objects, arrays, strings and integers)");
      for (const std::string_view word : {std::string_view("true"), std::string_view("false"), std::string_view("null")})
        if (text_.substr(pos_, word.size()) == word) {
          pos_ += word.size();
          JsonValue v;
          v.kind = word == "null" ? JsonValue::Kind::Null : JsonValue::Kind::Boolean;
          v.boolean = word == "true";
          return v;
        }
      fail("unexpected '", printable(c), "' where a value should start");
    }
    fail("unexpected '", printable(c), "' where a value should start");
  }

  JsonValue parse_object(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::Object;
    expect('{');
    skip_whitespace();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return v;
    }
    // Names seen so far: a hash set keeps a header of a million names linear, not quadratic.
    std::unordered_set<std::string> seen;
    for (;;) {
      skip_whitespace();
      if (at_end() || peek() != '"') fail("expected a member name in double quotes");
      std::string key = parse_string();
      // A duplicate would let two readers of one file disagree on which entry counts.
      if (!seen.insert(key).second) fail("duplicate name \"", key, "\"");
      skip_whitespace();
      expect(':');
      skip_whitespace();
      v.members.push_back(JsonMember{std::move(key), parse_value(depth + 1)});
      skip_whitespace();
      if (at_end()) fail("object not closed: the text ended");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  JsonValue parse_array(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::Array;
    expect('[');
    skip_whitespace();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_whitespace();
      // A parsed value takes ~100 bytes per byte of "0," text: bound arrays so that a hostile
      // header cannot turn its 100 MB into gigabytes.
      if (v.elements.size() == max_array_) fail("array longer than ", max_array_, " elements");
      v.elements.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (at_end()) fail("array not closed: the text ended");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  JsonValue parse_integer() {
    const std::size_t start = pos_;
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (at_end() || peek() < '0' || peek() > '9') fail("expected a digit after '-'");
    if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
      fail("numbers may not have leading zeros");
    // Accumulate as a negative number so that INT64_MIN is representable and overflow is exact.
    std::int64_t value = 0;
    constexpr std::int64_t min = INT64_MIN;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value < (min + digit) / 10) {
        pos_ = start;
        fail("integer ", std::string(number_text(start)), " does not fit in 64 bits");
      }
      value = value * 10 - digit;
      ++pos_;
    }
    if (!at_end() && (peek() == '.' || peek() == 'e' || peek() == 'E')) {
      if (!whole_grammar_) fail("only integers are expected here, not fractions or exponents");
      return parse_fraction(start);
    }
    if (!negative) {
      if (value == min) {
        pos_ = start;
        fail("integer ", std::string(number_text(start)), " does not fit in 64 bits");
      }
      value = -value;
    }
    JsonValue v;
    v.kind = JsonValue::Kind::Integer;
    v.integer = value;
    return v;
  }

  /// The rest of a number whose integer part [start, pos_) has been read: JSON's grammar
  /// ('.' digits, then e or E, a sign and digits), converted by from_chars.
  JsonValue parse_fraction(std::size_t start) {
    auto digits = [&](const char* what) {
      if (at_end() || peek() < '0' || peek() > '9') fail("expected a digit ", what);
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    };
    if (peek() == '.') {
      ++pos_;
      digits("after '.'");
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      digits("in the exponent");
    }
    JsonValue v;
    v.kind = JsonValue::Kind::Number;
    const auto [end, error] = std::from_chars(text_.data() + start, text_.data() + pos_, v.number);
    if (error != std::errc() || end != text_.data() + pos_) {
      pos_ = start;
      fail("number ", std::string(text_.substr(start, std::min<std::size_t>(40, text_.size() - start))),
           " is out of a double's range");
    }
    return v;
  }

  std::string_view number_text(std::size_t start) const {
    std::size_t end = start + 1;
    while (end < text_.size() && text_[end] >= '0' && text_[end] <= '9' && end - start < 40) ++end;
    return text_.substr(start, end - start);
  }

  unsigned parse_hex4() {
    if (text_.size() - pos_ < 4) fail("\\u escape needs four hex digits but the text ended");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') u |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= static_cast<unsigned>(c - 'A' + 10);
      else fail("\\u escape needs four hex digits, found '", printable(c), "'");
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // Copies one raw UTF-8 sequence starting at pos_, rejecting overlong forms, surrogates and
  // code points past U+10FFFF: names must compare equal only when their text is equal.
  void copy_utf8_sequence(std::string& out) {
    const auto lead = static_cast<unsigned char>(peek());
    int extra = 0;
    unsigned cp = 0, min_cp = 0;
    if (lead >= 0xc2 && lead <= 0xdf) extra = 1, cp = lead & 0x1f, min_cp = 0x80;
    else if (lead >= 0xe0 && lead <= 0xef) extra = 2, cp = lead & 0x0f, min_cp = 0x800;
    else if (lead >= 0xf0 && lead <= 0xf4) extra = 3, cp = lead & 0x07, min_cp = 0x10000;
    else fail("invalid UTF-8 byte ", printable(static_cast<char>(lead)), " in a string");
    if (text_.size() - pos_ <= static_cast<std::size_t>(extra)) fail("truncated UTF-8 sequence in a string");
    for (int i = 1; i <= extra; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + static_cast<std::size_t>(i)]);
      if ((b & 0xc0) != 0x80) fail("invalid UTF-8 continuation byte in a string");
      cp = (cp << 6) | (b & 0x3f);
    }
    if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      fail("invalid UTF-8 sequence (overlong, surrogate or beyond U+10FFFF) in a string");
    out.append(text_.substr(pos_, static_cast<std::size_t>(extra) + 1));
    pos_ += static_cast<std::size_t>(extra) + 1;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("string not closed: the text ended");
      const char c = peek();
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character ", printable(c), " inside a string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        copy_utf8_sequence(out);
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("escape not finished: the text ended");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) fail("\\u escape is a lone low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            // A high surrogate must be followed by an escaped low one: together one code point.
            if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
              fail("\\u escape is a high surrogate without its low surrogate");
            pos_ += 2;
            const unsigned low = parse_hex4();
            if (low < 0xdc00 || low > 0xdfff) fail("\\u escape: high surrogate followed by a non-low surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("unknown escape '\\", printable(e), "'");
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  int max_depth_;
  std::size_t max_array_;
  std::size_t max_values_;
  bool whole_grammar_;
  std::size_t values_ = 0;
};

}  // namespace detail

/// Parses `text` as one JSON value (objects, arrays, strings, integers), strictly: no trailing
/// text, no duplicate member names, valid UTF-8 and escapes, integers that fit in 64 bits.
/// Throws polyshard::Error naming the byte offset and the fault.
/// @param text       the JSON text (not necessarily NUL-terminated)
/// @param max_depth  deepest nesting accepted (bounds the recursion on hostile input)
/// @param max_array  most elements accepted in one array (bounds memory on hostile input)
/// @param max_values most values accepted in all (bounds the parsed tree's memory)
inline JsonValue parse_json(std::string_view text, int max_depth = 16, std::size_t max_array = 1 << 20,
                            std::size_t max_values = 1 << 22) {
  return detail::JsonParser(text, max_depth, max_array, max_values).parse_document();
}

/// Parses `text` with the whole JSON grammar: also fractions and exponents (Kind::Number),
/// true, false and null; for configuration files such as Hugging Face's config.json. Limits and
/// errors as parse_json's.
inline JsonValue parse_json_document(std::string_view text, int max_depth = 16, std::size_t max_array = 1 << 20,
                                     std::size_t max_values = 1 << 22) {
  return detail::JsonParser(text, max_depth, max_array, max_values, true).parse_document();
}

/// Appends `s` to `out` as a JSON string literal (quotes, escapes for '"', '\\' and controls).
inline void append_json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (u < 0x20) out += std::string("\\u00") + hex[u >> 4] + hex[u & 15];
    else out += c;
  }
  out += '"';
}

}  // namespace polyshard
