#include "checkpoints/manifest.h"

#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "checkpoints/h5.h"
#include "checkpoints/store.h"
#include "config/json.h"
#include "core/check.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestFormat = "llmtrain-checkpoint-manifest";
constexpr int64_t kManifestVersion = 1;
// The last line of the file: the XXH64 of every byte before it.
constexpr const char* kSelfKey = "  \"manifest_xxh64\": \"";

std::string hex(uint64_t h) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, h);
  return text;
}

uint64_t parse_hex(const std::string& s, const std::string& where) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw Error(where + ": \"" + detail::escaped(s) + "\" is not 16 hex digits");
  return std::stoull(s, nullptr, 16);
}

}  // namespace

const ManifestFile* Manifest::find(const std::string& name) const {
  for (const ManifestFile& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

ManifestFile hash_file(const std::string& dir, const std::string& name) {
  const fs::path path = fs::path(dir) / name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                   XXH64_freeState);
  LLMT_CHECK(state && XXH64_reset(state.get(), 0) == XXH_OK, "XXH64 state");
  std::vector<char> buf(size_t{4} << 20);
  ManifestFile out{name, 0, 0};
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    XXH64_update(state.get(), buf.data(), static_cast<size_t>(n));
    out.bytes += n;
  }
  if (in.bad()) throw Error("reading " + path.string() + " failed");
  out.xxh64 = XXH64_digest(state.get());
  return out;
}

void write_manifest(const std::string& dir, const Manifest& m) {
  std::ostringstream body;
  body << "{\n  \"format\": \"" << kManifestFormat << "\",\n  \"version\": " << kManifestVersion
       << ",\n  \"step\": " << m.step << ",\n  \"files\": [";
  for (size_t i = 0; i < m.files.size(); ++i)
    body << (i ? "," : "") << "\n    {\"name\": \"" << m.files[i].name
         << "\", \"bytes\": " << m.files[i].bytes << ", \"xxh64\": \"" << hex(m.files[i].xxh64)
         << "\"}";
  body << "\n  ],\n";
  const std::string text = body.str();
  const std::string all = text + kSelfKey + hex(XXH64(text.data(), text.size(), 0)) + "\"\n}\n";
  // Whole or not at all: a temporary name, synced, then renamed (a manifest added to an existing
  // checkpoint by verify --upgrade must never be seen half written).
  const fs::path path = fs::path(dir) / kManifestFile;
  const fs::path tmp = fs::path(dir) / (std::string(".") + kManifestFile + ".tmp");
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << all;
      out.close();
      if (!out) throw Error("writing " + tmp.string() + " failed (a full disk?)");
    }
    h5::fsync_path(tmp.string());
    fs::rename(tmp, path);
  } catch (...) {
    // Nothing of a failed write stays in the checkpoint (verify --upgrade writes into a whole one).
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  h5::fsync_path(dir);
}

void write_manifest_of(const std::string& dir, int64_t step, int world) {
  Manifest m;
  m.step = step;
  m.files.push_back(hash_file(dir, kIndexFile));
  for (int r = 0; r < world; ++r) m.files.push_back(hash_file(dir, rank_file_name(r)));
  write_manifest(dir, m);
}

std::optional<Manifest> read_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / kManifestFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const std::string where = "checkpoint " + dir + ": " + kManifestFile;
  // Bounded: a manifest lists a few lines per rank file.
  const auto size = fs::file_size(path, ec);
  if (ec || size > (size_t{64} << 20))
    throw Error(detail::concat(where, ": ", ec ? ec.message() : detail::concat(size, " bytes"),
                               ", not a manifest"));
  std::string text(size, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    in.read(text.data(), static_cast<std::streamsize>(size));
    if (!in) throw Error(where + ": cannot read it");
  }
  const size_t self = text.rfind(std::string("\n") + kSelfKey);
  if (self == std::string::npos)
    throw Error(where + ": no manifest_xxh64 line: it is corrupt or not a manifest");
  const size_t hex_at = self + 1 + std::string(kSelfKey).size();
  // The whole file is covered: the checksum line ends it, exactly as written.
  if (text.size() != hex_at + 16 + 4 || text.compare(hex_at + 16, 4, "\"\n}\n") != 0)
    throw Error(where +
                ": it does not end with its manifest_xxh64 line and \"}\": truncated, "
                "extended or not a manifest");
  const uint64_t stored = parse_hex(text.substr(hex_at, 16), where + ": manifest_xxh64");
  const uint64_t actual = XXH64(text.data(), self + 1, 0);
  if (stored != actual)
    throw Error(detail::concat(where, ": its checksum differs (manifest_xxh64 ", hex(stored),
                               " stored, ", hex(actual),
                               " of its text): it was edited or is corrupt"));
  const Json doc = parse_json(text, where);
  const Json* format = doc.find("format");
  const Json* version = doc.find("version");
  const Json* step = doc.find("step");
  const Json* files = doc.find("files");
  if (!format || format->string != kManifestFormat || !version ||
      version->number != kManifestVersion || !step || step->kind != Json::Kind::number || !files ||
      files->kind != Json::Kind::array)
    throw Error(where + ": not a version-1 llmtrain checkpoint manifest");
  Manifest m;
  m.step = static_cast<int64_t>(step->number);
  for (const Json& f : files->items) {
    const Json* name = f.find("name");
    const Json* bytes = f.find("bytes");
    const Json* h = f.find("xxh64");
    if (!name || name->kind != Json::Kind::string || !bytes || bytes->kind != Json::Kind::number ||
        !h || h->kind != Json::Kind::string || name->string.find('/') != std::string::npos ||
        name->string.empty() || name->string[0] == '.')
      throw Error(where + ": a malformed entry in files");
    m.files.push_back({name->string, static_cast<int64_t>(bytes->number),
                       parse_hex(h->string, where + ": " + detail::escaped(name->string))});
  }
  for (const ManifestFile& f : m.files) {
    const fs::path p = fs::path(dir) / f.name;
    if (!fs::exists(p, ec))
      throw Error("checkpoint " + dir + ": " + detail::escaped(f.name) + " is missing (" +
                  kManifestFile + " lists it)");
    const auto have = fs::file_size(p, ec);
    if (ec || static_cast<int64_t>(have) != f.bytes)
      throw Error(detail::concat("checkpoint ", dir, ": ", detail::escaped(f.name), " has ", have,
                                 " bytes; the manifest says ", f.bytes,
                                 " (truncated, extended or replaced; nothing was parsed)"));
  }
  return m;
}

void check_file(const std::string& dir, const Manifest& m, const std::string& name) {
  const ManifestFile* want = m.find(name);
  if (!want)
    throw Error("checkpoint " + dir + ": " + name + " is not listed in " + kManifestFile +
                " (a file from another checkpoint?)");
  const ManifestFile have = hash_file(dir, name);
  if (have.bytes != want->bytes || have.xxh64 != want->xxh64)
    throw Error(detail::concat("checkpoint ", dir, ": ", name, " differs from the manifest (",
                               have.bytes, " bytes, xxh64 ", hex(have.xxh64),
                               "; the manifest says ", want->bytes, " bytes, xxh64 ",
                               hex(want->xxh64),
                               "): it is corrupt or from another checkpoint; nothing of it was "
                               "parsed (a checkpoint edited on purpose is read unchecked once its ",
                               kManifestFile, " is deleted)"));
}

}  // namespace llmt::ckpt
