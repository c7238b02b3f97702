// Crash consistency by replay: the file operations of a save, recorded through the file layer
// (FileOperation, polyshard/io/atomic_file.hpp), are applied one by one to a model of a file
// system that keeps, beside what each file and directory holds now, what a power loss could leave
// of it. A file's bytes survive as of its last fsync (or empty, if it never was). For the names,
// two models, each allowing what the other does not, and a save must hold under both:
// - POSIX's promise alone: a directory's names survive as of its last fsync;
// - an ordered metadata journal (ext4, XFS): the name changes (create, rename, swap, remove)
//   reach the disk in the order they were made, every one before a directory fsync surely, and
//   any number of the later ones, as the journal may commit at any time.
// After every prefix of a save, each state a power loss could leave is a DurableTree, which the
// test writes out as a real directory and loads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "polyshard/io/atomic_file.hpp"

namespace polyshard::test {

/// A FileOperation kept after the call: its bytes copied.
struct RecordedOperation {
  FileOperation::Kind kind;
  std::filesystem::path path, target;
  std::vector<std::byte> bytes;
};

/// Records every file operation made while it lives (from any thread), in the order they happened.
class FileOperationLog {
 public:
  FileOperationLog() {
    detail::file_operation_recorder() = [this](const FileOperation& op) {
      std::lock_guard lock(mutex_);
      operations_.push_back({op.kind, op.path, op.target, {op.bytes.begin(), op.bytes.end()}});
    };
  }
  ~FileOperationLog() { detail::file_operation_recorder() = nullptr; }
  FileOperationLog(const FileOperationLog&) = delete;
  FileOperationLog& operator=(const FileOperationLog&) = delete;

  std::vector<RecordedOperation> operations() const {
    std::lock_guard lock(mutex_);
    return operations_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<RecordedOperation> operations_;
};

/// A directory tree as a power loss left it: each path relative to the root, with a file's bytes
/// (nullopt: a directory). Ordered, so that equal trees compare equal.
using DurableTree = std::map<std::string, std::optional<std::vector<std::byte>>>;

/// Writes `tree` under `out`, a directory created for it.
inline void write_tree(const DurableTree& tree, const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  for (const auto& [path, bytes] : tree) {  // a directory sorts before what it holds
    if (!bytes) {
      std::filesystem::create_directory(out / path);
      continue;
    }
    std::ofstream file(out / path, std::ios::binary);
    file.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  }
}

/// The file system under one directory, as it is and as a power loss could leave it.
class PowerLossModel {
 public:
  /// The directory `root` as `contents` holds it (a copy of `root` taken before the save), all of
  /// it durable; the operations applied name paths under `root`.
  PowerLossModel(std::filesystem::path root, const std::filesystem::path& contents)
      : root_path_(std::move(root)), root_(scan(contents)) {
    remember_names(root_);
  }

  void apply(const RecordedOperation& op) {
    using Kind = FileOperation::Kind;
    switch (op.kind) {
      case Kind::create_file:
      case Kind::create_directory: {
        auto node = std::make_shared<Node>();
        node->directory = op.kind == Kind::create_directory;
        auto [parent, name] = parent_of(op.path);
        change_name({.parent = parent, .name = name, .node = node});
        break;
      }
      case Kind::write: {
        Node& file = *lookup(op.path);
        file.data.insert(file.data.end(), op.bytes.begin(), op.bytes.end());
        break;
      }
      case Kind::fsync_file: {
        Node& file = *lookup(op.path);
        file.durable_data = file.data;
        break;
      }
      case Kind::fsync_directory: {
        Node& dir = *lookup(op.path);
        dir.durable_entries = dir.entries;
        journal_committed_ = journal_.size();
        break;
      }
      case Kind::rename: {
        auto [from_parent, from_name] = parent_of(op.path);
        auto [to_parent, to_name] = parent_of(op.target);
        const auto node = from_parent->entries.at(from_name);
        change_name({.parent = from_parent, .name = from_name, .node = nullptr});
        change_name({.parent = to_parent, .name = to_name, .node = node, .joined = true});
        break;
      }
      case Kind::exchange: {
        auto [a_parent, a_name] = parent_of(op.path);
        auto [b_parent, b_name] = parent_of(op.target);
        const auto a = a_parent->entries.at(a_name), b = b_parent->entries.at(b_name);
        change_name({.parent = a_parent, .name = a_name, .node = b});
        change_name({.parent = b_parent, .name = b_name, .node = a, .joined = true});
        break;
      }
      case Kind::remove: {
        auto [parent, name] = parent_of(op.path);
        change_name({.parent = parent, .name = name, .node = nullptr});
        break;
      }
    }
  }

  /// Every state a power loss now could leave, without repeats: first under POSIX's promise, then
  /// under the journal with only what it must have committed, then with each further change
  /// committed. The first two are what must hold once a save has returned.
  std::vector<DurableTree> power_loss_states() const {
    std::vector<DurableTree> out{posix_state(), journal_state(journal_committed_)};
    for (std::size_t n = journal_committed_ + 1; n <= journal_.size(); ++n) {
      if (n < journal_.size() && journal_[n].joined) continue;  // half a rename or swap never commits
      out.push_back(journal_state(n));
    }
    std::vector<DurableTree> distinct;
    for (auto& state : out)
      if (std::find(distinct.begin(), distinct.end(), state) == distinct.end()) distinct.push_back(std::move(state));
    return distinct;
  }

 private:
  struct Node {
    bool directory = false;
    std::vector<std::byte> data, durable_data;  // a file's
    std::map<std::string, std::shared_ptr<Node>> entries, durable_entries;  // a directory's, by name
  };
  /// One change of a name in the journal: `name` in `parent` now names `node` (none: removed).
  /// `joined`: the second half of a rename or swap, committed with the change before it.
  struct NameChange {
    Node* parent;
    std::string name;
    std::shared_ptr<Node> node;
    bool joined = false;
  };
  using Names = std::map<const Node*, std::map<std::string, std::shared_ptr<Node>>>;

  static std::shared_ptr<Node> scan(const std::filesystem::path& path) {
    auto node = std::make_shared<Node>();
    node->directory = std::filesystem::is_directory(path);
    if (node->directory) {
      for (const auto& entry : std::filesystem::directory_iterator(path))
        node->entries[entry.path().filename().string()] = scan(entry.path());
      node->durable_entries = node->entries;
    } else {
      std::ifstream in(path, std::ios::binary);
      const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (char c : chars) node->data.push_back(static_cast<std::byte>(c));
      node->durable_data = node->data;
    }
    return node;
  }

  void remember_names(const std::shared_ptr<Node>& node) {
    if (!node->directory) return;
    initial_names_[node.get()] = node->entries;
    for (const auto& [name, child] : node->entries) remember_names(child);
  }

  void change_name(NameChange change) {
    if (change.node) change.parent->entries[change.name] = change.node;
    else change.parent->entries.erase(change.name);
    journal_.push_back(std::move(change));
  }

  std::vector<std::string> components(const std::filesystem::path& path) const {
    const std::filesystem::path relative = path.lexically_relative(root_path_);
    if (relative.empty() || *relative.begin() == "..")
      throw std::logic_error("PowerLossModel: '" + path.string() + "' is outside '" + root_path_.string() + "'");
    std::vector<std::string> out;
    for (const auto& part : relative)
      if (part != ".") out.push_back(part.string());
    return out;
  }
  Node* walk(const std::vector<std::string>& parts, std::size_t count) const {
    Node* node = root_.get();
    for (std::size_t i = 0; i < count; ++i) {
      const auto it = node->entries.find(parts[i]);
      if (!node->directory || it == node->entries.end())
        throw std::logic_error("PowerLossModel: no '" + parts[i] + "' in the model");
      node = it->second.get();
    }
    return node;
  }
  Node* lookup(const std::filesystem::path& path) const {
    const auto parts = components(path);
    return walk(parts, parts.size());
  }
  std::pair<Node*, std::string> parent_of(const std::filesystem::path& path) const {
    const auto parts = components(path);
    if (parts.empty()) throw std::logic_error("PowerLossModel: '" + path.string() + "' is the model's root");
    return {walk(parts, parts.size() - 1), parts.back()};
  }

  /// The tree reached from the root through `names`, each file with its last fsynced bytes.
  static void collect(const Node& dir, const Names& names, const std::string& prefix, DurableTree& out) {
    const auto it = names.find(&dir);
    if (it == names.end()) return;  // a directory no durable change gave a name: empty
    for (const auto& [name, node] : it->second) {
      const std::string path = prefix.empty() ? name : prefix + "/" + name;
      if (node->directory) {
        out[path] = std::nullopt;
        collect(*node, names, path, out);
      } else {
        out[path] = node->durable_data;
      }
    }
  }

  DurableTree posix_state() const {
    Names names;
    gather_durable_names(root_, names);
    DurableTree out;
    collect(*root_, names, "", out);
    return out;
  }
  static void gather_durable_names(const std::shared_ptr<Node>& dir, Names& names) {
    if (!dir->directory || names.count(dir.get())) return;
    names[dir.get()] = dir->durable_entries;
    for (const auto& [name, child] : dir->durable_entries) gather_durable_names(child, names);
  }

  /// The names after the first `committed` changes of the journal.
  DurableTree journal_state(std::size_t committed) const {
    Names names = initial_names_;
    for (std::size_t i = 0; i < committed; ++i) {
      const NameChange& change = journal_[i];
      if (change.node) names[change.parent][change.name] = change.node;
      else names[change.parent].erase(change.name);
    }
    DurableTree out;
    collect(*root_, names, "", out);
    return out;
  }

  std::filesystem::path root_path_;
  std::shared_ptr<Node> root_;
  Names initial_names_;
  std::vector<NameChange> journal_;
  std::size_t journal_committed_ = 0;  // changes a directory fsync has made durable
};

}  // namespace polyshard::test
