// Linked into every Catch2 program of the suite: an assertion made from any thread but the one
// that runs the test cases stops the program with the assertion's file and line. Catch2 is not
// thread-safe, so such an assertion can lose its result or corrupt the report; rank bodies
// compute and return (or throw), and the test thread checks.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

class AssertionsOnMainThread : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testRunStarting(const Catch::TestRunInfo& info) override {
    runner_ = std::this_thread::get_id();
    TestEventListenerBase::testRunStarting(info);
  }
  // Both hooks: a passing assertion reaches only the first, some failures only the second.
  void assertionStarting(const Catch::AssertionInfo& info) override { check(info); }
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    check(stats.assertionResult.getSourceInfo(), stats.assertionResult.getTestMacroName());
    return TestEventListenerBase::assertionEnded(stats);
  }

 private:
  void check(const Catch::AssertionInfo& info) const { check(info.lineInfo, info.macroName); }
  void check(const Catch::SourceLineInfo& where, Catch::StringRef macro) const {
    if (std::this_thread::get_id() == runner_) return;
    std::fprintf(stderr,
                 "%s:%zu: %.*s made from a thread other than the test's: Catch2 assertions are not thread-safe. "
                 "Let the rank body return or throw what it found, and check it on the test thread "
                 "(tests/support/error_of.hpp)\n",
                 where.file, where.line, static_cast<int>(macro.size()), macro.data());
    std::fflush(stderr);
    std::abort();
  }

  std::thread::id runner_ = std::this_thread::get_id();
};

}  // namespace

CATCH_REGISTER_LISTENER(AssertionsOnMainThread)
