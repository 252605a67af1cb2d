// Creating output files and directories where other users may have planted something (a shared
// scratch or /tmp): no symbolic link is followed at a file's last component, no file is written
// through that this user does not own, temporary names are created exclusively, and directories
// thetad makes are private (0700), those it writes into owned by this user. Errors are returned
// as text (or errno): each caller names its key and decides the exit code. The checks of an entry
// and the exclusive temporaries are the launcher's too (launch/private_dir: files relative to a
// directory descriptor, `open_own_at`, `create_unique_at`), each worded by its caller.
//
//   const int fd = safe_file::create_fresh(dir + "/manifest.json.part");  // O_EXCL | O_NOFOLLOW
//   if (const std::string why = safe_file::make_own_dirs(dir); !why.empty()) refuse(why);
#pragma once

#include <sys/types.h>

#include <string>

namespace thetad::safe_file {

// Creates `path` anew for writing (O_WRONLY): a file left under that name (a temporary file of an
// interrupted write, or anything planted there, a symbolic link included) is unlinked first (a
// directory is not), then the name is created with O_CREAT | O_EXCL | O_NOFOLLOW, so that no link
// is followed and no existing file is written through. Returns the descriptor (close-on-exec),
// or -1 with errno set.
int create_fresh(const std::string& path, mode_t mode = 0644);

// A file created in directory `dir` under a name of its own: `prefix` + 8 random characters +
// `suffix` (O_CREAT | O_EXCL | O_NOFOLLOW). Returns the descriptor with its path in *path, or -1
// with errno set.
int create_unique(const std::string& dir, const std::string& prefix, const std::string& suffix, std::string* path,
                  mode_t mode = 0600);
// The same relative to the directory descriptor `dir` (AT_FDCWD: `prefix` holds the directory):
// the name created (relative to `dir`) in *name.
int create_unique_at(int dir, const std::string& prefix, const std::string& suffix, std::string* name, mode_t mode);

// What makes an entry no file of this user's to write into (the checks of open_own_at and
// check_entry_at); each caller words it for its own users.
struct EntryCheck {
  enum Problem { none, link, not_regular, other_owner, other_links, error } problem = none;
  uid_t uid = 0;  // the owner, for other_owner
  int err = 0;    // errno, for error
};
// The rules: a regular file of this user's (the effective uid), with one link where `one_link`
// (a hard link planted to another file is refused), or a character device where `devices`
// (/dev/null: only root makes those).
struct EntryRules {
  bool one_link = false;
  bool devices = false;
};
// Opens `name` relative to the directory descriptor `dir` (AT_FDCWD: a path) with
// `flags` | O_CREAT | O_NOFOLLOW | O_CLOEXEC (`mode` for a new file) and checks what was opened
// against `rules`. Returns the descriptor, or -1 with *check saying why.
int open_own_at(int dir, const std::string& name, int flags, mode_t mode, EntryRules rules, EntryCheck* check);
// The same checks of the entry `name` of `dir` itself (not followed), without opening it; an
// absent entry is `error` with ENOENT.
EntryCheck check_entry_at(int dir, const std::string& name, EntryRules rules);

// Opens `path` for writing (`flags`: O_WRONLY or O_RDWR, with O_TRUNC or O_APPEND as wanted)
// without following a symbolic link at its last component, creating it (`mode`) where missing;
// an existing one must be a regular file owned by this user (the effective uid), or a character
// device (/dev/null: only root makes those). Returns the
// descriptor, or -1 with *why set ("is a symbolic link", "is owned by uid 1001", strerror).
int open_own(const std::string& path, int flags, mode_t mode, std::string* why);

// mkdir -p `path`, each directory it creates private (0700). With `own`, the last component must
// then be a directory owned by this user, reached through a symbolic link only where that link
// is this user's own. Returns "" or what is wrong.
std::string make_dirs(const std::string& path, bool own);

// Whether this user can create files in directory `dir`, or where it does not exist yet, in the
// nearest existing directory above it (where it would be made): a file created there under a
// name of its own and removed. Returns "" or why not (naming the directory tried).
std::string probe_writable(const std::string& dir);

}  // namespace thetad::safe_file
