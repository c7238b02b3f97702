// JSON read into a small tree (JsonValue) by nlohmann-json's SAX parser, strictly, for file
// headers we do not trust (objects, arrays, strings with escapes and integers, under limits on
// depth, length and count) and, with the whole grammar, for configuration files. Anything else,
// and any malformed byte, is an error that names it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
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

/// Builds a JsonValue from nlohmann-json's SAX events, with the limits a header we do not trust
/// needs: nesting depth, elements per array, values in all (each costs a JsonValue of about 100
/// bytes however short its text: "[]," is 3 bytes), no duplicate member names (two readers of one
/// file would disagree on which entry counts), integers that fit in 64 bits, and, unless the
/// whole grammar is asked for, neither fractions nor true, false and null. nlohmann-json's lexer
/// checks the rest: UTF-8, escapes and surrogate pairs, the grammar, trailing text.
class JsonTreeBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  JsonTreeBuilder(int max_depth, std::size_t max_array, std::size_t max_values, bool whole_grammar)
      : max_depth_(max_depth), max_array_(max_array), max_values_(max_values), whole_grammar_(whole_grammar) {}

  JsonValue take() { return std::move(root_); }

  bool null() override {
    scalars_only_in_whole_grammar();
    return add(of(JsonValue::Kind::Null));
  }
  bool boolean(bool b) override {
    scalars_only_in_whole_grammar();
    JsonValue v = of(JsonValue::Kind::Boolean);
    v.boolean = b;
    return add(std::move(v));
  }
  bool number_integer(number_integer_t n) override {
    JsonValue v = of(JsonValue::Kind::Integer);
    v.integer = n;
    return add(std::move(v));
  }
  bool number_unsigned(number_unsigned_t n) override {
    if (n > static_cast<number_unsigned_t>(INT64_MAX)) fail("integer ", n, " does not fit in 64 bits");
    JsonValue v = of(JsonValue::Kind::Integer);
    v.integer = static_cast<std::int64_t>(n);
    return add(std::move(v));
  }
  /// A fraction or an exponent, or an integer too long for 64 bits (the lexer reads it as a double).
  bool number_float(number_float_t x, const string_t& text) override {
    if (text.find_first_of(".eE") == string_t::npos) fail("integer ", text.substr(0, 40), " does not fit in 64 bits");
    if (!whole_grammar_) fail("only integers are expected here, not fractions or exponents (", text.substr(0, 40), ")");
    JsonValue v = of(JsonValue::Kind::Number);
    v.number = x;
    return add(std::move(v));
  }
  bool string(string_t& text) override {
    JsonValue v = of(JsonValue::Kind::String);
    v.string = std::move(text);
    return add(std::move(v));
  }
  bool binary(binary_t&) override { fail("binary values are not JSON"); }
  bool start_object(std::size_t) override { return open(JsonValue::Kind::Object); }
  bool key(string_t& name) override {
    Frame& f = stack_.back();
    if (!f.names.insert(name).second) fail("duplicate name \"", name, "\"");
    f.value.members.push_back(JsonMember{std::move(name), JsonValue{}});
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(JsonValue::Kind::Array); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann-json's message without its "[json.exception.parse_error.101] " tag.
    std::string_view what = e.what();
    if (const auto tag = what.find("] "); what.rfind("[json.exception.", 0) == 0 && tag != std::string_view::npos)
      what.remove_prefix(tag + 2);
    detail::throw_error("invalid JSON at byte ", byte, ": ", what);
  }

 private:
  struct Frame {
    JsonValue value;
    std::unordered_set<std::string> names;  // a hash set keeps a million names linear, not quadratic
  };

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    detail::throw_error("invalid JSON: ", parts...);
  }
  static JsonValue of(JsonValue::Kind kind) {
    JsonValue v;
    v.kind = kind;
    return v;
  }
  void scalars_only_in_whole_grammar() const {
    if (!whole_grammar_)
      fail("true, false and null are not expected here (only objects, arrays, strings and integers)");
  }
  /// Counts a value at the current depth and checks the limits it is under.
  void count() {
    if (static_cast<int>(stack_.size()) > max_depth_) fail("values nested deeper than ", max_depth_, " levels");
    if (++values_ > max_values_) fail("more than ", max_values_, " values");
    if (!stack_.empty() && stack_.back().value.kind == JsonValue::Kind::Array &&
        stack_.back().value.elements.size() == max_array_)
      fail("array longer than ", max_array_, " elements");
  }
  bool add(JsonValue v) {
    count();
    place(std::move(v));
    return true;
  }
  /// Where a finished value goes: the open object's last member, the open array, or the root.
  void place(JsonValue v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return;
    }
    JsonValue& parent = stack_.back().value;
    if (parent.kind == JsonValue::Kind::Object) parent.members.back().value = std::move(v);
    else parent.elements.push_back(std::move(v));
  }
  bool open(JsonValue::Kind kind) {
    count();
    stack_.push_back(Frame{of(kind), {}});
    return true;
  }
  bool close() {
    JsonValue done = std::move(stack_.back().value);
    stack_.pop_back();
    place(std::move(done));
    return true;
  }

  int max_depth_;
  std::size_t max_array_;
  std::size_t max_values_;
  bool whole_grammar_;
  std::size_t values_ = 0;
  std::vector<Frame> stack_;
  JsonValue root_;
};

inline JsonValue parse_json_tree(std::string_view text, int max_depth, std::size_t max_array, std::size_t max_values,
                                 bool whole_grammar) {
  // nlohmann-json's lexer ends the input at a NUL byte (for C strings): "{}" followed by NUL
  // padding would pass for "{}". No JSON text holds one (a string needs "\u0000").
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    throw_error("invalid JSON at byte ", nul, ": a NUL byte, which no JSON text holds");
  JsonTreeBuilder builder(max_depth, max_array, max_values, whole_grammar);
  nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder, nlohmann::json::input_format_t::json,
                            /*strict=*/true);
  return builder.take();
}

}  // namespace detail

/// Parses `text` as one JSON value (objects, arrays, strings, integers), strictly: no trailing
/// text, no duplicate member names, valid UTF-8 and escapes, integers that fit in 64 bits.
/// Throws polyshard::Error naming the fault (and, for a fault of the grammar, its byte offset).
/// @param text       the JSON text (not necessarily NUL-terminated)
/// @param max_depth  deepest nesting accepted (bounds the recursion on hostile input)
/// @param max_array  most elements accepted in one array (bounds memory on hostile input)
/// @param max_values most values accepted in all (bounds the parsed tree's memory)
inline JsonValue parse_json(std::string_view text, int max_depth = 16, std::size_t max_array = 1 << 20,
                            std::size_t max_values = 1 << 22) {
  return detail::parse_json_tree(text, max_depth, max_array, max_values, /*whole_grammar=*/false);
}

/// Parses `text` with the whole JSON grammar: also fractions and exponents (Kind::Number),
/// true, false and null; for configuration files such as Hugging Face's config.json. Limits and
/// errors as parse_json's.
inline JsonValue parse_json_document(std::string_view text, int max_depth = 16, std::size_t max_array = 1 << 20,
                                     std::size_t max_values = 1 << 22) {
  return detail::parse_json_tree(text, max_depth, max_array, max_values, /*whole_grammar=*/true);
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
