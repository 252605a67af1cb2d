// The launcher's run directories and the files in them, safe in places other users may write
// (a shared /tmp, a project directory): every part of a directory's path is opened relative to
// its parent, a symbolic link followed only when root or this user owns it; the directory itself
// is created 0700 and must be this user's own, writable by no one else; files in it are opened
// relative to its descriptor with O_NOFOLLOW, created 0600, and replaced through a temporary
// file created with O_EXCL under a random name. So no file another user planted (a symbolic
// link to a shell's rc file, a FIFO) is written through, truncated or waited on. The files' checks
// and temporaries are common/safe_file's (open_own_at, create_unique_at), in the launcher's words.
#pragma once

#include <string>
#include <vector>

#include "launch/sys.hpp"

namespace thetad::launch {

// Opens the directory `path` for this user's files, creating the missing parts 0700 when
// `create`. Throws ConfigError (exit 2) naming `what`, the path and the part that is refused:
// a symbolic link another user owns; a part every user may write without the sticky bit;
// a part inside a directory every user may write (/tmp) owned by another user; a last part
// (the directory itself) that is not this user's or that every user may write.
Fd open_private_dir(const std::string& path, bool create, const std::string& what);

// Opens `name` in `dir` to append (created 0600): a regular file of this user's with one link,
// never through a symbolic link or into a FIFO. An invalid Fd on failure, with `why` set.
Fd open_append_at(int dir, const std::string& name, std::string& why);
// Writes `text` to `name` in `dir` whole: a temporary file (O_EXCL, random name) renamed over it.
bool replace_file_at(int dir, const std::string& name, const std::string& text);
// At most `max` bytes of the regular file `name` in `dir` (not through a symbolic link).
bool read_file_at(int dir, const std::string& name, std::string& out, size_t max = 1 << 16);
// Why the entry `name` of `dir` may not be one of this user's files ("" when it may: absent, or
// a regular file of this user's with one link).
std::string unsafe_entry(int dir, const std::string& name);
// The names in `dir`, "." and ".." left out.
std::vector<std::string> list_dir(int dir);

}  // namespace thetad::launch
