// safetensors: strict JSON, round trips of every dtype, conversion, the malformed corpus, and
// atomic files and checkpoint directories.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

#include "io/malformed_corpus.hpp"
#include "io/temp_dir.hpp"
#include "polyshard/io/atomic_directory.hpp"
#include "polyshard/io/safetensors.hpp"

using namespace polyshard;
namespace fs = std::filesystem;

namespace {
std::vector<std::byte> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}
void write_all(const fs::path& p, std::span<const std::byte> bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}
std::uint64_t header_length(std::span<const std::byte> bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(bytes[static_cast<std::size_t>(i)]);
  return n;
}
}  // namespace

TEST_CASE("strict JSON: escapes, surrogate pairs and 64-bit integers decode exactly", "[io]") {
  const JsonValue v = parse_json(R"( {"a\"\\\/\b\f\n\r\t": [0, -9223372036854775808, 9223372036854775807],
                                      "\u00e9\ud83d\ude00": "x"} )");
  REQUIRE(v.kind == JsonValue::Kind::Object);
  REQUIRE(v.members.size() == 2);
  CHECK(v.members[0].name == "a\"\\/\b\f\n\r\t");
  const auto& xs = v.members[0].value.elements;
  REQUIRE(xs.size() == 3);
  CHECK(xs[1].integer == INT64_MIN);
  CHECK(xs[2].integer == INT64_MAX);
  CHECK(v.members[1].name == "\xc3\xa9\xf0\x9f\x98\x80");  // é and U+1F600 in UTF-8
  CHECK_THROWS_WITH(parse_json("[9223372036854775808]"), Catch::Contains("does not fit in 64 bits"));
  CHECK_THROWS_WITH(parse_json(R"({"a":1,"a":2})"), Catch::Contains("duplicate name \"a\""));
  CHECK_THROWS_WITH(parse_json("[1,]"), Catch::Contains("unexpected ']'"));
  CHECK_THROWS_WITH(parse_json("{\"a\" 1}"), Catch::Contains("expected ':'"));
}

TEST_CASE("a header of many tiny values is refused before its tree outgrows the text", "[io]") {
  // The budget on values, at a small scale: 2000 arrays of 21 zeros are 44,001 values (the
  // arrays count), refused under a budget of 44,000 and parsed under one of 44,001.
  std::string text = "[";
  for (int i = 0; i < 2000; ++i) {
    text += i ? ",[" : "[";
    for (int j = 0; j < 21; ++j) text += j ? ",0" : "0";
    text += ']';
  }
  text += ']';
  CHECK_THROWS_WITH(parse_json(text, 16, 1 << 20, 44'000), Catch::Contains("more than 44000 values"));
  CHECK(parse_json(text, 16, 1 << 20, 44'001).elements.size() == 2000);
  // The default budget, through the safetensors reader: 4,204,201 values in 8.4 MB of text would
  // take about 400 MB parsed. They come as 4,200 members, each an array of 1,000 zeros (the
  // reader's arrays hold a shape or two offsets, up to safetensors_max_rank elements).
  std::string header = "{";
  for (int i = 0; i < 4200; ++i) {
    (header += i ? ",\"" : "\"") += std::to_string(i) + "\":[";
    for (int j = 0; j < 1000; ++j) header += j ? ",0" : "0";
    header += ']';
  }
  header += '}';
  std::string file(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) file[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
  file += header;
  CHECK_THROWS_WITH(SafetensorsFile::from_memory(std::as_bytes(std::span(file)), "many.safetensors"),
                    Catch::Contains("many.safetensors") && Catch::Contains("more than 4194304 values"));
}

TEST_CASE("a slice of a tensor reads without the rest, within bounds", "[io]") {
  const Tensor<float> t = Tensor<float>::from({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  SafetensorsWriter w;
  w.add("t", t);
  const auto bytes = w.to_bytes();
  const SafetensorsFile f = SafetensorsFile::from_memory(bytes);
  std::vector<float> out(4);
  f.read_elements("t", 3, std::span<float>(out));
  CHECK(out == std::vector<float>{3, 4, 5, 6});
  std::vector<double> wide(2);
  f.read_elements("t", 8, std::span<double>(wide), DTypeConversion::convert);
  CHECK(wide == std::vector<double>{8, 9});
  CHECK_THROWS_WITH(f.read_elements("t", 7, std::span<float>(out)), Catch::Contains("elements [7, 11) were asked for"));
  CHECK_THROWS_WITH(f.read_elements("t", 0, std::span<double>(wide)), Catch::Contains("not F64"));
}

TEMPLATE_TEST_CASE("safetensors round trip keeps values, shapes and metadata", "[io]", float, double, half, bfloat16,
                   std::int32_t, std::int64_t) {
  TempDir dir;
  auto a = Tensor<TestType>::empty({3, 5});
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data()[i] = element_cast<TestType>(static_cast<float>(i) - 7.0f);
  const auto scalar = Tensor<TestType>::full({}, element_cast<TestType>(3.0f));
  SafetensorsWriter w;
  w.add("a.weight", a).add("s", scalar).add("at", a.transpose()).add_metadata("format", "pt");
  w.write(dir / "t.safetensors");

  const auto bytes = read_all(dir / "t.safetensors");
  CHECK(header_length(bytes) % 8 == 0);
  CHECK(bytes == w.to_bytes());
  const SafetensorsFile f = SafetensorsFile::open(dir / "t.safetensors");
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.info("a.weight").dtype == to_safetensors_dtype(dtype_v<TestType>));
  CHECK(*f.metadata("format") == "pt");
  const Tensor<TestType> b = f.read<TestType>("a.weight");
  CHECK(b.shape() == Shape{3, 5});
  CHECK(std::memcmp(b.data(), a.data(), a.bytes()) == 0);
  CHECK(f.read<TestType>("s").shape() == Shape{});
  CHECK(f.read<TestType>("s").data()[0] == scalar.data()[0]);
  const Tensor<TestType> t = f.read<TestType>("at");  // a transposed view is written in row-major order
  CHECK(t.shape() == Shape{5, 3});
  CHECK(t.at(4, 1) == a.at(1, 4));
  CHECK_THROWS_WITH(f.read<TestType>("missing"), Catch::Contains("t.safetensors': no tensor named 'missing'"));
}

TEST_CASE("safetensors layout: ordered by element size then name, aligned, independent of insertion order", "[io]") {
  const auto w8 = Tensor<double>::zeros({3});
  const auto w4 = Tensor<float>::zeros({1});
  const auto w2 = Tensor<half>::zeros({3});
  SafetensorsWriter x, y;
  x.add("z16", w2).add("b32", w4).add("a32", w4).add("m64", w8);
  y.add("m64", w8).add("a32", w4).add("z16", w2).add("b32", w4);
  CHECK(x.to_bytes() == y.to_bytes());
  const auto bytes = x.to_bytes();
  const SafetensorsFile f = SafetensorsFile::from_memory(bytes);
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) {
    order.push_back(t.name);
    CHECK(t.data_begin % safetensors_dtype_size(t.dtype) == 0);
  }
  CHECK(order == std::vector<std::string>{"m64", "a32", "b32", "z16"});
  CHECK_THROWS_WITH(SafetensorsWriter().add("a", w4).add("a", w4), Catch::Contains("'a' added twice"));
  CHECK_THROWS_WITH(SafetensorsWriter().add("__metadata__", w4), Catch::Contains("cannot name a tensor"));
  // The writer holds itself to the reader's rules rather than write a file it would refuse.
  SafetensorsWriter bad;
  bad.add("\xff", w4);
  CHECK_THROWS_WITH(bad.to_bytes(), Catch::Contains("ill-formed UTF-8"));
}

TEST_CASE("safetensors conversion is explicit, exact to element_cast, and shapes must match", "[io]") {
  auto a = Tensor<float>::empty({4, 3});
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data()[i] = 1.0f + 1.0f / static_cast<float>(2 * i + 3);  // odd denominators: inexact
  SafetensorsWriter w;
  w.add("a", a).add("ids", Tensor<std::int32_t>::from({2}, {5, -6}));
  const auto bytes = w.to_bytes();
  const SafetensorsFile f = SafetensorsFile::from_memory(bytes, "model.safetensors");

  CHECK_THROWS_WITH(f.read<bfloat16>("a"), Catch::Contains("'a' is stored as F32, not BF16"));
  const Tensor<bfloat16> b = f.read<bfloat16>("a", DTypeConversion::convert);
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    CHECK(static_cast<float>(b.data()[i]) == static_cast<float>(element_cast<bfloat16>(a.data()[i])));
    CHECK(static_cast<float>(b.data()[i]) != a.data()[i]);  // bf16 cannot hold these exactly
  }
  const Tensor<std::int64_t> ids = f.read<std::int64_t>("ids", DTypeConversion::convert);
  CHECK(ids.to_vector() == std::vector<std::int64_t>{5, -6});
  CHECK_THROWS_WITH(f.read<float>("ids", DTypeConversion::convert), Catch::Contains("do not mix"));

  auto dst = Tensor<float>::zeros({3, 4});
  CHECK_THROWS_WITH(f.read_into("a", dst),
                    Catch::Contains("model.safetensors': tensor 'a' has shape (4, 3) but the destination has shape (3, 4)"));
  auto ok = Tensor<float>::zeros({4, 3});
  f.read_into("a", ok);
  CHECK(ok.to_vector() == a.to_vector());
}

TEST_CASE("a dtype polyshard does not store is validated but not read", "[io]") {
  const auto bytes = test::safetensors_bytes(R"({"mask":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 3);
  const SafetensorsFile f = SafetensorsFile::from_memory(bytes);
  CHECK(f.info("mask").nbytes() == 3);
  CHECK_THROWS_WITH(f.read<float>("mask", DTypeConversion::convert), Catch::Contains("dtype BOOL, which polyshard does not read"));
}

TEST_CASE("every file of the malformed corpus is refused with an error naming the file and the lie", "[io]") {
  const auto corpus = test::malformed_safetensors_corpus();
  REQUIRE(corpus.size() > 40);
  TempDir dir;
  const std::size_t i = GENERATE_COPY(range(std::size_t(0), corpus.size()));
  const test::CorpusFile& c = corpus[i];
  INFO(c.name);
  std::string file = c.name;
  std::replace(file.begin(), file.end(), ' ', '_');
  const fs::path path = dir / (file + ".safetensors");
  write_all(path, c.bytes);
  CHECK_THROWS_WITH(SafetensorsFile::open(path),
                    Catch::Contains("safetensors file '" + path.string() + "'") && Catch::Contains(c.error));
  CHECK_THROWS_WITH(SafetensorsFile::from_memory(c.bytes, "mem"), Catch::Contains("'mem'") && Catch::Contains(c.error));
}

TEST_CASE("the valid corpus reads back, and every tensor in it can be read", "[io]") {
  for (const test::CorpusFile& c : test::valid_safetensors_corpus()) {
    INFO(c.name);
    const SafetensorsFile f = SafetensorsFile::from_memory(c.bytes);
    for (const auto& t : f.tensors()) {
      const bool floating = safetensors_dtype_name(t.dtype)[0] != 'I';
      const std::int64_t n = floating ? f.read<double>(t.name, DTypeConversion::convert).numel()
                                      : f.read<std::int64_t>(t.name, DTypeConversion::convert).numel();
      CHECK(n == std::int64_t(t.numel));
    }
  }
  const SafetensorsFile meta = SafetensorsFile::from_memory(test::valid_safetensors_corpus()[1].bytes);
  CHECK(*meta.metadata("a") == "b\xc3\xa9\xf0\x9f\x98\x80");
}

TEST_CASE("reading a directory or a missing file is an error, not a crash", "[io]") {
  TempDir dir;
  CHECK_THROWS_WITH(SafetensorsFile::open(dir.path()), Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(SafetensorsFile::open(dir / "nope.safetensors"), Catch::Contains("nope.safetensors': cannot open"));
}

TEST_CASE("an atomic file write replaces the file whole or not at all", "[io]") {
  TempDir dir;
  const fs::path p = dir / "f.bin";
  write_file_atomically(p, [](FileSink& s) { s.write(std::as_bytes(std::span("old", 3))); });
  CHECK(read_text(p) == "old");
  CHECK_THROWS_WITH(write_file_atomically(p,
                                          [](FileSink& s) {
                                            s.write(std::as_bytes(std::span("partial", 7)));
                                            throw Error("disk on fire");
                                          }),
                    "disk on fire");
  CHECK(read_text(p) == "old");
  CHECK(names_in(dir.path()) == std::vector<std::string>{"f.bin"});  // the temporary is gone
  write_file_atomically(p, [](FileSink& s) { s.write(std::as_bytes(std::span("new!", 4))); });
  CHECK(read_text(p) == "new!");
  CHECK(names_in(dir.path()) == std::vector<std::string>{"f.bin"});
}

TEST_CASE("an atomic checkpoint directory survives a save that dies midway", "[io]") {
  TempDir dir;
  const fs::path ckpt = dir / "ckpt";
  auto save = [&](float value) {
    write_directory_atomically(ckpt, [&](const fs::path& tmp) {
      SafetensorsWriter().add("w", Tensor<float>::full({4}, value)).write(tmp / "model.safetensors");
      write_text(tmp / "step.txt", std::to_string(value));
    });
  };
  auto load = [&] { return SafetensorsFile::open(ckpt / "model.safetensors").read<float>("w").data()[0]; };
  save(1.0f);
  CHECK(load() == 1.0f);
  save(2.0f);  // replaces the previous one in one swap
  CHECK(load() == 2.0f);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"ckpt"});

  SECTION("a fill that throws leaves the old checkpoint and no temporary") {
    CHECK_THROWS_WITH(write_directory_atomically(ckpt,
                                                 [&](const fs::path& tmp) {
                                                   write_text(tmp / "step.txt", "3");
                                                   throw Error("killed");
                                                 }),
                      "killed");
    CHECK(load() == 2.0f);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"ckpt"});
  }
  SECTION("a process killed mid-save leaves a partial temporary that is ignored, then cleaned") {
    // What a crashed writer (pid 999999999 cannot be running) leaves: half a model file.
    const fs::path partial = dir / ".ckpt.tmp-999999999-0";
    fs::create_directory(partial);
    std::vector<std::byte> half = SafetensorsWriter().add("w", Tensor<float>::full({4}, 9.0f)).to_bytes();
    half.resize(half.size() / 2);
    write_all(partial / "model.safetensors", half);
    CHECK(load() == 2.0f);
    CHECK_THROWS(SafetensorsFile::open(partial / "model.safetensors"));
    save(3.0f);
    CHECK(load() == 3.0f);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"ckpt"});
  }
  SECTION("a save killed between the two renames of the fallback path is undone") {
    fs::rename(ckpt, dir / ".ckpt.old-999999999-0");
    CHECK(remove_stale_checkpoint_temporaries(ckpt) == 1);
    CHECK(load() == 2.0f);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"ckpt"});
  }
  SECTION("the temporary of a writer that is still running is left alone") {
    const fs::path live = dir / (".ckpt.tmp-" + std::to_string(::getppid()) + "-0");
    fs::create_directory(live);
    save(4.0f);
    CHECK(fs::exists(live));
    CHECK(load() == 4.0f);
  }
}
