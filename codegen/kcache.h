/* codegen/kcache.h — the on-disk cache of compiled kernels both backends
 * share: its directory, keys, and whole-file reads and atomic writes.
 * Entries are named by a 128-bit hash of everything that determines their
 * content (source or IR text, target, compiler version, options), and end
 * in a footer with a hash of their own name and bytes: an entry altered,
 * cut short, written by an older mptc or copied from another name reads as
 * missing (compiled again, with a note once a process). A cache that cannot
 * be read or written only costs time. */
#ifndef MPT_CODEGEN_KCACHE_H
#define MPT_CODEGEN_KCACHE_H

#include <stddef.h>

/* $MPTC_CACHE_DIR, else $HOME/.cache/mptc; written into buf, returned */
const char *mpt_kcache_dir(char *buf, size_t n);
/* 0 when MPTC_CACHE=0 turns the cache off (always compile, write nothing) */
int mpt_kcache_enabled(void);
/* 32 hex digits of the hash of parts[0..n_parts) (each with its NUL) */
void mpt_kcache_key(const char *const *parts, int n_parts, char out[33]);
/* the entry's bytes as written (NUL-terminated, *len without it), or
 * NULL when it is missing or does not match its footer */
char *mpt_kcache_read(const char *path, size_t *len);
/* mkdir -p: 0, or -1 when a part cannot be made */
int mpt_make_dirs(const char *dir);
/* p[0..len) and the footer, written beside, then renamed: a concurrent
 * reader never sees half a file; creates the file's directory; 0 or -1 */
int mpt_kcache_write(const char *path, const void *p, size_t len);

#endif
