/*
 * fence_local.c - an in-process high-water mark per resource, for a service
 * that keeps its own state (lease/fence.h).
 *
 * The marks are a sorted array (binary search), guarded by one mutex that
 * is held across the durable write too: a check returns only once its mark
 * is on disk, and two checks of one handle never reorder their writes.
 *
 * The file, when there is one, is written whole on every advance: a temp
 * file beside it, fsync, rename over the old one, fsync of the directory.
 * A reader therefore sees the old file or the new one, never a mix; the
 * trailer (count and checksum) catches what rename cannot: a file cut short
 * or altered by something else. Writing the whole file is O(resources) per
 * advance, which suits the few resources of one service, not millions.
 *
 *   lease-fence-local 1
 *   <mark> <resource, hex>         one line per resource, sorted
 *   end <count> <FNV-1a 64 of every byte above, hex>
 *
 * Resources are hex-encoded so that any byte of a key (spaces, newlines)
 * survives the round trip. A lock file (<path>.lock, flock) keeps a second
 * process from using the same marks: two writers would each lose the
 * other's advances.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lease_int.h"

#define FILE_HEADER "lease-fence-local 1\n"
/* A bound on what open() reads: far above any sensible set of marks. */
#define FILE_MAX ((off_t)64 << 20)

typedef struct {
    char *name;   /* the resource, NUL-terminated (keys hold no NUL) */
    uint64_t mark;
} fence_entry;

struct lease_fence_local {
    pthread_mutex_t mu;
    fence_entry *v;      /* sorted by strcmp(name) */
    size_t n, cap;
    int dirty;           /* memory is ahead of the file: the last write failed */
    int dir_fd, lock_fd; /* -1 without a file */
    char *path;          /* as given, for messages */
    char *base, *tmp;    /* names inside the directory */
};

static uint64_t fnv1a(uint64_t h, const char *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_START 0xcbf29ce484222325ULL

/* The index of `name`, or where it would go (*found 0). */
static size_t entry_find(const lease_fence_local *f, const char *name, int *found)
{
    size_t lo = 0, hi = f->n;

    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->v[mid].name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int entry_insert(lease_fence_local *f, size_t at, const char *name,
                        uint64_t mark)
{
    char *copy;

    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        fence_entry *v = realloc(f->v, cap * sizeof(*v));
        if (v == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        f->v = v;
        f->cap = cap;
    }
    if ((copy = strdup(name)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    memmove(f->v + at + 1, f->v + at, (f->n - at) * sizeof(*f->v));
    f->v[at].name = copy;
    f->v[at].mark = mark;
    f->n++;
    return 0;
}

/* ---- the file ------------------------------------------------------------ */

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The whole file's text, malloc'ed, in *out (length *len). */
static int file_render(char **out, size_t *len, const lease_fence_local *f)
{
    size_t cap = sizeof(FILE_HEADER) + 64, i, at, k;
    char *buf;

    for (i = 0; i < f->n; i++)
        cap += 22 + 2 * strlen(f->v[i].name);
    if ((buf = malloc(cap)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    at = (size_t)snprintf(buf, cap, "%s", FILE_HEADER);
    for (i = 0; i < f->n; i++) {
        const unsigned char *p = (const unsigned char *)f->v[i].name;
        at += (size_t)snprintf(buf + at, cap - at, "%" PRIu64 " ", f->v[i].mark);
        for (k = 0; p[k]; k++)
            at += (size_t)snprintf(buf + at, cap - at, "%02x", p[k]);
        buf[at++] = '\n';
    }
    at += (size_t)snprintf(buf + at, cap - at, "end %zu %016" PRIx64 "\n", f->n,
                           fnv1a(FNV_START, buf, at));
    *out = buf;
    *len = at;
    return 0;
}

/* Replace the file with the marks in memory, durably (see the top). */
static int file_save(lease_fence_local *f)
{
    char *text = NULL;
    size_t len = 0;
    int fd, rc, err = 0;
    const char *step = "write";

    if ((rc = file_render(&text, &len, f)) < 0)
        return rc;
    fd = openat(f->dir_fd, f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                0600);
    if (fd < 0) {
        err = errno;
        step = "create the temp file of";
    } else if (write_all(fd, text, len) < 0 || fsync(fd) < 0) {
        err = errno ? errno : EIO;
    }
    if (fd >= 0 && close(fd) < 0 && err == 0)
        err = errno;
    if (err == 0 && renameat(f->dir_fd, f->tmp, f->dir_fd, f->base) < 0) {
        err = errno;
        step = "rename into";
    }
    if (err == 0 && fsync(f->dir_fd) < 0) {
        err = errno;
        step = "sync the directory of";
    }
    free(text);
    if (err)
        return lease__seterr(LEASE_ESTORE, "fence marks '%.200s': cannot %s it: %s",
                             f->path, step, strerror(err));
    return 0;
}

/* Read the whole file into a NUL-terminated buffer; ENOENT gives *out NULL. */
static int file_read(char **out, size_t *len, lease_fence_local *f)
{
    struct stat st;
    char *buf;
    size_t got = 0;
    int fd = openat(f->dir_fd, f->base, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

    *out = NULL;
    if (fd < 0 && errno == ENOENT)
        return 0;
    if (fd < 0)
        return lease__seterr(LEASE_ESTORE, "fence marks '%.200s': %s", f->path,
                             strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > FILE_MAX) {
        close(fd);
        return lease__seterr(LEASE_ESTORE, "fence marks '%.200s': not a regular "
                             "file of at most 64 MiB", f->path);
    }
    if ((buf = malloc((size_t)st.st_size + 1)) == NULL) {
        close(fd);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    /* Bounded: each pass reads at least one byte or ends. */
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}

static int corrupt(const lease_fence_local *f, size_t line, const char *what)
{
    return lease__seterr(LEASE_ESTORE, "fence marks '%.200s' are corrupt or cut "
                         "short (line %zu: %s); the marks are unknown, so nothing "
                         "is accepted: restore the file or remove it knowingly",
                         f->path, line, what);
}

/* One "<mark> <hex>" line (NUL-terminated, no newline) into the table. */
static int parse_entry(lease_fence_local *f, char *line, size_t lineno)
{
    char *sp = strchr(line, ' '), *end, name[LEASE_KEY_MAX + 1];
    size_t hexlen, i;
    uint64_t mark;
    int found;

    if (sp == NULL || sp == line || line[0] == '0' || line[0] == '-')
        return corrupt(f, lineno, "not '<mark> <resource>'");
    *sp = '\0';
    errno = 0;
    mark = strtoull(line, &end, 10);
    if (*end != '\0' || errno || mark == 0 || mark > LEASE__TOKEN_MAX)
        return corrupt(f, lineno, "mark not in 1 .. 2^63-1");
    hexlen = strlen(sp + 1);
    if (hexlen == 0 || hexlen % 2 || hexlen / 2 > LEASE_KEY_MAX)
        return corrupt(f, lineno, "bad resource name");
    for (i = 0; i < hexlen / 2; i++) {
        int hi = lease__hexval(sp[1 + 2 * i]), lo = lease__hexval(sp[2 + 2 * i]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
            return corrupt(f, lineno, "bad resource name");
        name[i] = (char)(hi << 4 | lo);
    }
    name[i] = '\0';
    i = entry_find(f, name, &found);
    if (found || i != f->n)
        return corrupt(f, lineno, "resources out of order or repeated");
    return entry_insert(f, i, name, mark);
}

static int file_parse(lease_fence_local *f, char *text, size_t len)
{
    size_t hlen = strlen(FILE_HEADER), lineno = 1, count;
    char *p = text + hlen, *nl, *end;
    uint64_t sum = FNV_START;
    int rc;

    if (strlen(text) != len)
        return corrupt(f, 1, "NUL byte in the file");
    if (len < hlen || memcmp(text, FILE_HEADER, hlen) != 0)
        return corrupt(f, 1, "not a fence marks file of this version");
    sum = fnv1a(sum, text, hlen);
    for (;;) {
        lineno++;
        if ((nl = strchr(p, '\n')) == NULL)
            return corrupt(f, lineno, "no 'end' line");
        if (strncmp(p, "end ", 4) == 0)
            break;
        /* Summed before parse_entry cuts the line into pieces. */
        sum = fnv1a(sum, p, (size_t)(nl + 1 - p));
        *nl = '\0';
        if ((rc = parse_entry(f, p, lineno)) < 0)
            return rc;
        p = nl + 1;
    }
    errno = 0;
    count = (size_t)strtoull(p + 4, &end, 10);
    if (errno || *end != ' ' || count != f->n)
        return corrupt(f, lineno, "count does not match");
    if (strtoull(end + 1, &end, 16) != sum || *end != '\n' || end + 1 != text + len)
        return corrupt(f, lineno, "checksum does not match");
    return 0;
}

/* ---- open and close ------------------------------------------------------ */

/* Directory and names of `path`, the lock taken, the marks loaded. */
static int fence_attach(lease_fence_local *f, const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir, *text, *lock;
    size_t len;
    int rc, first;

    dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    f->path = strdup(path);
    f->base = strdup(slash ? slash + 1 : path);
    len = f->base ? strlen(f->base) + 8 : 0;
    f->tmp = len ? malloc(len) : NULL;
    lock = len ? malloc(len) : NULL;
    if (dir == NULL || f->path == NULL || f->tmp == NULL || lock == NULL) {
        free(dir);
        free(lock);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    snprintf(f->tmp, len, ".%s.tmp", f->base);
    snprintf(lock, len, "%s.lock", f->base);
    if (*f->base == '\0' || strcmp(f->base, ".") == 0 || strcmp(f->base, "..") == 0) {
        free(dir);
        free(lock);
        return lease__seterr(LEASE_EINVALID, "fence marks path '%.200s' names no file", path);
    }
    f->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (f->dir_fd < 0) {
        free(lock);
        return lease__seterr(LEASE_EINVALID, "fence marks '%.200s': its directory: %s",
                             path, strerror(errno));
    }
    /* Made here, once: a lock file without its marks file means the marks
     * were lost (deleted, or a volume not mounted), not a first use. */
    f->lock_fd = openat(f->dir_fd, lock, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                        0600);
    first = f->lock_fd >= 0;
    if (f->lock_fd < 0 && errno == EEXIST)
        f->lock_fd = openat(f->dir_fd, lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    free(lock);
    if (f->lock_fd < 0)
        return lease__seterr(LEASE_ESTORE, "fence marks '%.200s': lock file: %s", path,
                             strerror(errno));
    if (flock(f->lock_fd, LOCK_EX | LOCK_NB) < 0)
        return lease__seterr(errno == EWOULDBLOCK ? LEASE_EBUSY : LEASE_ESTORE,
                             "fence marks '%.200s' are in use by another process%s%s",
                             path, errno == EWOULDBLOCK ? "" : ": ",
                             errno == EWOULDBLOCK ? "" : strerror(errno));
    if ((rc = file_read(&text, &len, f)) < 0)
        return rc;
    if (text == NULL && !first)
        return lease__seterr(LEASE_ESTORE, "fence marks '%.200s' are missing but their "
                             "lock file is there: the marks were lost, so nothing is "
                             "accepted; remove '%.200s.lock' to start over knowingly",
                             path, path);
    if (text == NULL) {
        /* First use: an empty set of marks, on disk before any check. */
        f->dirty = 1;
        return file_save(f);
    }
    rc = file_parse(f, text, len);
    free(text);
    return rc;
}

void lease_fence_local_close(lease_fence_local *f)
{
    size_t i;

    if (f == NULL)
        return;
    for (i = 0; i < f->n; i++)
        free(f->v[i].name);
    free(f->v);
    if (f->lock_fd >= 0)
        close(f->lock_fd); /* drops the flock */
    if (f->dir_fd >= 0)
        close(f->dir_fd);
    free(f->path);
    free(f->base);
    free(f->tmp);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int lease_fence_local_open(lease_fence_local **out, const char *path)
{
    lease_fence_local *f;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if (path != NULL && *path == '\0')
        return lease__seterr(LEASE_EINVALID, "fence marks path is empty (NULL: in memory)");
    if ((f = calloc(1, sizeof(*f))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    f->dir_fd = f->lock_fd = -1;
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        free(f);
        return lease__seterr(LEASE_ENOMEM, "cannot create a mutex");
    }
    if (path != NULL && (rc = fence_attach(f, path)) < 0) {
        lease_fence_local_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* ---- the check ----------------------------------------------------------- */

static int check_args(const lease_fence_local *f, const char *resource)
{
    if (f == NULL)
        return lease__seterr(LEASE_EINVALID, "fence handle is NULL");
    return lease__check_name("resource", resource);
}

/* Under f->mu: accept or refuse `token`, advancing and saving the mark. */
static int check_locked(uint64_t *mark, lease_fence_local *f, const char *resource,
                        uint64_t token)
{
    int found, rc;
    size_t i = entry_find(f, resource, &found);

    if (found && token < f->v[i].mark) {
        *mark = f->v[i].mark;
        return lease__seterr(LEASE_ESTALE, "resource '%s': stale token %" PRIu64
                             " < mark %" PRIu64, resource, token, f->v[i].mark);
    }
    if (!found && (rc = entry_insert(f, i, resource, token)) < 0)
        return rc;
    /* Memory moves first and stays even if the write fails: a mark that is
     * too high only refuses more, and `dirty` makes the next accepted check
     * write again before it answers. */
    if (found && token > f->v[i].mark) {
        f->v[i].mark = token;
        f->dirty = 1;
    } else if (!found) {
        f->dirty = 1;
    }
    *mark = f->v[i].mark;
    if (f->dir_fd < 0 || !f->dirty)
        return 0;
    if ((rc = file_save(f)) < 0)
        return rc;
    f->dirty = 0;
    return 0;
}

int lease_fence_local_check(uint64_t *mark, lease_fence_local *f,
                            const char *resource, uint64_t token)
{
    uint64_t m = 0;
    int rc;

    if ((rc = check_args(f, resource)) < 0)
        return rc;
    if (token == 0 || token > LEASE__TOKEN_MAX)
        return lease__seterr(LEASE_EINVALID, "token must be 1 .. 2^63-1");
    pthread_mutex_lock(&f->mu);
    rc = check_locked(&m, f, resource, token);
    pthread_mutex_unlock(&f->mu);
    if (mark != NULL)
        *mark = m;
    return rc;
}

int lease_fence_local_mark(uint64_t *mark, lease_fence_local *f, const char *resource)
{
    int found, rc;
    size_t i;

    if (mark == NULL)
        return lease__seterr(LEASE_EINVALID, "mark is NULL");
    *mark = 0;
    if ((rc = check_args(f, resource)) < 0)
        return rc;
    pthread_mutex_lock(&f->mu);
    i = entry_find(f, resource, &found);
    if (found)
        *mark = f->v[i].mark;
    pthread_mutex_unlock(&f->mu);
    if (!found)
        return lease__seterr(LEASE_ENOTFOUND, "resource '%s' has no mark", resource);
    return 0;
}
