/*
 * fuzz_redis.c - the Redis store reading replies it cannot trust.
 *
 * A fake Redis runs in a thread of this process on 127.0.0.1 (an ephemeral
 * port, kept for the whole run). The commands of a connection's set-up are
 * answered as a healthy server would (SCRIPT LOAD: a 40-character sha;
 * CONFIG GET: appendonly yes, appendfsync always; AUTH, SELECT: +OK), so
 * that the input goes to the operations. The input is split at 0x01 bytes
 * into replies: every other command gets the next one, sent as it is. When
 * a reply is not exactly whole RESP values (hiredis' own reader decides),
 * the connection is closed after it, so no call waits for bytes that never
 * come; once the replies are used up, every command gets an error. The
 * fuzzer stays fast.
 *
 * The store then runs acquire, renew, guarded put, release, inspect, list,
 * fence advance and mark, data get and history; the properties are those of
 * fuzz_etcd.c (outcomes are LEASE_E* codes with a message, tokens 1 ..
 * 2^63-1, ttls within the cap, no grant past its local deadline).
 */
#define _GNU_SOURCE /* accept4 */
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <strings.h>

#include "fuzz_util.h"
#include "lease_int.h"
#include "fuzz_store.h"

/* The replies: the input split at 0x01 (fuzz_store.h); `requests` counts
 * the replies sent since the input began. */
static fuzz_fake redis_fake = FUZZ_FAKE_INIT;

static const char redis_sha[] = "$40\r\n0123456789abcdef0123456789abcdef01234567\r\n";
static const char redis_config[] = "*4\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n"
                                   "$11\r\nappendfsync\r\n$6\r\nalways\r\n";

/* Could buf hold every array it announces? hiredis allocates an array's
 * elements as soon as it reads the header, so this reader (the fake
 * server's own, not the store's, which bounds its replies itself) would
 * take gigabytes for "*273709551\r\n". Each element is at least 3 bytes
 * (":\r\n"), so an array of more than len elements cannot be whole; any
 * '*' counts, in a string too: such a reply is then taken as not whole,
 * which only closes the connection after it. */
static int redis_arrays_fit(const uint8_t *buf, size_t len)
{
    size_t i;

    /* Bounded by len. */
    for (i = 0; i < len; i++) {
        unsigned long long n = 0;
        size_t j = i + 1;

        if (buf[i] != '*')
            continue;
        /* Bounded by len, and n stops growing past it. */
        for (; j < len && buf[j] >= '0' && buf[j] <= '9' && n <= len; j++)
            n = n * 10 + (unsigned long long)(buf[j] - '0');
        if (n > len)
            return 0;
    }
    return 1;
}

/* Is buf exactly one or more whole RESP values? */
static int redis_whole(const uint8_t *buf, size_t len)
{
    redisReader *r = redisReaderCreate();
    void *reply = NULL;
    int whole = 0;

    if (r == NULL)
        abort();
    if (len > 0 && redis_arrays_fit(buf, len) &&
        redisReaderFeed(r, (const char *)buf, len) == REDIS_OK) {
        while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != NULL) {
            freeReplyObject(reply);
            reply = NULL;
            whole = r->pos == r->len || r->len == 0;
        }
        if (r->err)
            whole = 0;
    }
    redisReaderFree(r);
    return whole;
}

/* Answer one command; 0 when the connection must close after it. */
static int redis_answer(int fd, const redisReply *cmd)
{
    const char *name = cmd->type == REDIS_REPLY_ARRAY && cmd->elements > 0 &&
                               cmd->element[0]->type == REDIS_REPLY_STRING
                           ? cmd->element[0]->str
                           : "";
    int keep;

    if (strcasecmp(name, "SCRIPT") == 0) {
        fuzz_write_all(fd, redis_sha, strlen(redis_sha));
        return 1;
    }
    if (strcasecmp(name, "CONFIG") == 0) {
        fuzz_write_all(fd, redis_config, strlen(redis_config));
        return 1;
    }
    if (strcasecmp(name, "AUTH") == 0 || strcasecmp(name, "SELECT") == 0) {
        fuzz_write_all(fd, "+OK\r\n", 5);
        return 1;
    }
    pthread_mutex_lock(&redis_fake.mu);
    if (redis_fake.requests < redis_fake.answers.n) {
        size_t i = redis_fake.requests++;
        fuzz_write_all(fd, redis_fake.answers.at[i], redis_fake.answers.len[i]);
        keep = redis_whole(redis_fake.answers.at[i], redis_fake.answers.len[i]);
    } else {
        /* Used up: an error keeps the connection, so that the calls left
         * fail at once instead of connecting again. */
        static const char none[] = "-ERR fuzz: no reply left\r\n";
        fuzz_write_all(fd, none, strlen(none));
        keep = 1;
    }
    pthread_mutex_unlock(&redis_fake.mu);
    return keep;
}

static void redis_connection(int fd)
{
    redisReader *r = redisReaderCreate();
    char buf[16384];

    if (r == NULL)
        abort();
    for (;;) {
        struct pollfd pfd = { fd, POLLIN, 0 };
        void *cmd = NULL;
        ssize_t n;

        if (poll(&pfd, 1, 2000) <= 0 || (n = recv(fd, buf, sizeof(buf), 0)) <= 0)
            break;
        if (redisReaderFeed(r, buf, (size_t)n) != REDIS_OK)
            break;
        while (redisReaderGetReply(r, &cmd) == REDIS_OK && cmd != NULL) {
            int keep = redis_answer(fd, cmd);
            freeReplyObject(cmd);
            cmd = NULL;
            if (!keep)
                goto done;
        }
        if (r->err)
            break;
    }
done:
    redisReaderFree(r);
}

static void *redis_serve(void *arg)
{
    int lfd = *(int *)arg;

    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            poll(NULL, 0, 10); /* out of descriptors, say: do not spin */
            continue;
        }
        redis_connection(fd);
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

/* A library must not kill its host: a SIGPIPE raised by writing to a
 * connection the server closed is a finding, saved as a crash (abort). */
static void redis_on_sigpipe(int sig)
{
    static const char msg[] = "FUZZ PROPERTY FAILED: SIGPIPE: the store wrote to a "
                              "connection the server had closed, which kills a "
                              "process that does not ignore SIGPIPE\n";
    (void)sig;
    if (write(2, msg, sizeof(msg) - 1) < 0)
        abort();
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static int lfd;
    const char *pipe_mode = getenv("LEASE_FUZZ_SIGPIPE");
    pthread_t t;

    (void)argc;
    (void)argv;
    lease_log_set(fuzz_quiet_log, NULL, LEASE_LOG_OFF);
    /* LEASE_FUZZ_SIGPIPE=ignore explores past that finding (tests/fuzz/README.md). */
    signal(SIGPIPE, pipe_mode && strcmp(pipe_mode, "ignore") == 0 ? SIG_IGN
                                                                  : redis_on_sigpipe);
    lfd = fuzz_listen(&redis_fake.port);
    if (fuzz_start_thread(&t, redis_serve, &lfd) != 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char url[64];

    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0?prefix=fuzz:", redis_fake.port);
    fuzz_store_input(&redis_fake, data, size, url);
    return 0;
}
