// Generation on the CPU with and without the key-value cache: the time of a new token with
// generate() (the prompt's forward once, then one position a token) against recomputing the
// whole prefix for every token, at growing context lengths, for GPT-2 and examples/08-own-model's
// Llama at the same width. With the cache a token costs its matrix products plus attention over
// the cached keys; without it, a whole forward of the context.
#include <thread>

#include "polyshard/nn/nn.hpp"
#include "llama.hpp"  // examples/08-own-model
#include "support/report.hpp"

using namespace polyshard;

namespace {

/// Greedy tokens after `prompt`, every token from the logits of the whole sequence so far.
template <class M>
std::vector<std::int32_t> generate_uncached(const M& model, std::vector<std::int32_t> tokens, std::int64_t n) {
  NoGradGuard no_grad;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto t = static_cast<std::int64_t>(tokens.size());
    const Tensor<float> logits = model.logits(Tensor<std::int32_t>::from({1, t}, tokens)).value().contiguous();
    const std::int64_t vocab = logits.size(2);
    const float* last = logits.data() + (t - 1) * vocab;
    tokens.push_back(std::int32_t(std::max_element(last, last + vocab) - last));
  }
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_generate.json");
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  cpu::set_blas_threads(threads);
  constexpr std::int64_t width = 256, layers = 4, heads = 8, positions = 1024, new_tokens = 32;
  std::vector<std::int64_t> prompts = {32, 224, 480, 992};  // contexts of 64, 256, 512, 1024
  if (args.quick) prompts = {32, 224};

  GptConfig cfg{.vocab_size = 256, .block_size = positions, .n_layer = layers, .n_head = heads, .n_embd = width};
  Gpt<float> gpt(cfg);
  FlatParameters<float> gpt_params(gpt);
  gpt_params.initialize(1);
  const own::LlamaConfig lc{.vocab_size = 256, .hidden_size = width, .intermediate_size = 8 * width / 3,
                            .num_hidden_layers = int(layers), .num_attention_heads = int(heads),
                            .num_key_value_heads = int(heads / 2), .max_position_embeddings = positions};
  own::Llama llama(lc);
  FlatParameters<float> llama_params(llama);
  llama_params.initialize(1);

  bench::Table table("Greedy generation on the CPU (fp32, batch 1): " + std::to_string(new_tokens) +
                     " new tokens after a prompt, with the key-value cache and recomputing every prefix");
  auto measure = [&](const std::string& name, const auto& model, std::int64_t prompt_length) {
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_length));
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t(splitmix64(i) % 256);
    std::vector<std::int32_t> cached, uncached;
    const SamplingConfig greedy{.new_tokens = new_tokens, .temperature = 0.0};
    // The prompt's one forward (filling the cache) alone, then the whole generation: the
    // difference is the new tokens' one position each.
    const double prefill = bench::median_seconds([&] { generate(model, prompt, {.new_tokens = 1, .temperature = 0.0}); }, 3, 1);
    const double with_cache = bench::median_seconds([&] { cached = generate(model, prompt, greedy); }, 3, 1);
    const double without = bench::median_seconds([&] { uncached = generate_uncached(model, prompt, new_tokens); },
                                                 args.quick ? 1 : 3, 1);
    const double cached_token = (with_cache - prefill) / double(new_tokens - 1), uncached_token = without / double(new_tokens);
    // The same tokens both ways, unless two logits tie within float rounding.
    std::int64_t same = 0;
    for (std::size_t i = prompt.size(); i < cached.size(); ++i) same += cached[i] == uncached[i];
    table.row()
        .set("model", name)
        .set("context", double(prompt_length + new_tokens), 0)
        .set("prompt forward ms", prefill * 1e3, 2)
        .set("ms a token, cached", cached_token * 1e3, 2)
        .set("ms a token, uncached", uncached_token * 1e3, 2)
        .set("speed-up a token", uncached_token / cached_token)
        .set("tokens/s with prompt, cached", double(new_tokens) / with_cache, 0)
        .set("same tokens", double(same), 0);
  };
  for (const std::int64_t p : prompts) {
    measure("GPT-2 L4 C256", gpt, p);
    measure("Llama L4 C256", llama, p);
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
