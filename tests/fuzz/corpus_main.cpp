// tests/fuzz/corpus_main.cpp — runs a fuzz target over files, without
// libFuzzer: the main of the fuzz targets in every ordinary build (plain,
// ASan+UBSan, TSan), so each CI run replays the committed corpus
// (tests/fuzz/corpus/<target>/) through the target's checks. With
// -DFAIRGATE_FUZZ=ON (clang) libFuzzer's main is linked instead
// (scripts/fuzz.sh, docs/fuzzing.md).
//
//   usage: fuzz_<target> FILE_OR_DIR...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p = argv[i];
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", p.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no input files: an empty corpus tests nothing\n");
    return 2;
  }
  for (const auto& f : files) {
    // Named first, so a failing check's output follows the input that made it.
    std::fprintf(stderr, "%s\n", f.c_str());
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    // A copy of exactly its size (so ASan sees a read past its end).
    const auto data = std::make_unique<std::uint8_t[]>(bytes.size() + (bytes.empty() ? 1 : 0));
    std::copy(bytes.begin(), bytes.end(), data.get());
    LLVMFuzzerTestOneInput(data.get(), bytes.size());
  }
  std::printf("%zu inputs ran\n", files.size());
  return 0;
}
