// `upipe tokenize IN.txt OUT.bin`: the byte-level tokenizer (one token per byte, vocabulary 256)
// into an llm.c .bin file that `upipe train` (data.kind = "files") and `upipe eval --tokens`
// read. `upipe tokenize DIR OUT`: every file of DIR one document, into the Megatron indexed
// dataset OUT.bin + OUT.idx that `upipe train` reads with data.documents = "index". One process
// does the work; run it without mpirun (under mpirun, rank 0 writes).
#include <cstdio>
#include <filesystem>

#include "apps/upipe/commands.h"
#include "train/tokenizer.h"

namespace upipe::app {
namespace {

struct Options {
  std::string in, out;
  bool force = false;
};

int run(Process& proc, const Options& opt) {
  if (!proc.root()) return 0;
  // OUT names a file (OUT.bin + OUT.idx for a directory): "" or "dir/" would write hidden
  // ".bin" and ".idx".
  const std::filesystem::path out(opt.out);
  if (opt.out.empty() || out.filename().empty() || out.stem().empty() ||
      out.filename() == "." || out.filename() == "..")
    throw ConfigError(fmt::format(
        "tokenize: the output '{}' names no file; give a path such as corpus (a directory's "
        "documents go to corpus.bin + corpus.idx)",
        opt.out));
  std::error_code ec;
  if (std::filesystem::is_directory(opt.in, ec)) {
    const TokenizedDocuments r = tokenize_documents(opt.in, opt.out, opt.force);
    std::printf(
        "%s: %lld documents, %lld tokens (bytes, vocabulary %lld) written to %s.bin + %s.idx\n",
        opt.in.c_str(), static_cast<long long>(r.documents), static_cast<long long>(r.tokens),
        static_cast<long long>(kByteVocab), r.prefix.c_str(), r.prefix.c_str());
    if (!r.skipped.empty()) std::printf("left out: %s\n", left_out(r).c_str());
    return 0;
  }
  const int64_t n = tokenize_bytes(opt.in, opt.out, opt.force);
  std::printf("%s: %lld tokens (bytes, vocabulary %lld) written to %s\n", opt.in.c_str(),
              static_cast<long long>(n), static_cast<long long>(kByteVocab), opt.out.c_str());
  return 0;
}

}  // namespace

Runner add_tokenize(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("IN", opt->in, "text file (any bytes), or a directory: one document per file")
      ->required();
  cmd.add_option("OUT", opt->out,
                 "llm.c .bin token file to write (uint16 ids); for a directory, the prefix of "
                 "OUT.bin + OUT.idx (a Megatron indexed dataset)")
      ->required();
  cmd.add_flag("--force", opt->force, "replace OUT (OUT.bin, OUT.idx) when it exists");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
