/*
 * redis_faults.c - the Redis store against a server that misbehaves at a
 * chosen moment: a tiny fake server speaking RESP, forked from the test.
 *
 * Whatever the server does, a call ends with a code - ESTORE when the store
 * failed or answered nonsense - never with a crash, and never with EBUSY or
 * success made up from a broken answer ("a store error never masquerades as
 * EBUSY or success").
 *
 * The client side of every case runs in a forked child too, so that a crash
 * in the library fails one case with its signal instead of the whole test.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "lease.h"
#include "redis_child.h"

/* ---- the fake server ------------------------------------------------------ */

typedef enum {
    FAKE_DROP_ON_CONFIG,    /* close the connection when CONFIG comes */
    /* The first connection is served in full (the durability settings are
     * good, so the store will check them again on its next connection)
     * until the first EVALSHA, which closes it; every later connection is
     * closed when CONFIG comes. */
    FAKE_DROP_ON_RECONNECT_CONFIG,
    FAKE_ACQUIRE_STRINGS,   /* answer the acquire script with ["x", "y"] */
    FAKE_ACQUIRE_NIL_TOKEN, /* answer the acquire script with [1, nil] */
} fake_mode;

static const char sha40[] = "0123456789abcdef0123456789abcdef01234567";

/* Read one RESP command (an array of bulk strings) into argv; returns argc,
 * or -1 at EOF or on anything else. */
static int read_cmd(FILE *f, char argv[8][64])
{
    char line[128];
    long n, i;

    if (fgets(line, sizeof(line), f) == NULL || line[0] != '*')
        return -1;
    n = strtol(line + 1, NULL, 10);
    for (i = 0; i < n; i++) {
        long len, j;
        if (fgets(line, sizeof(line), f) == NULL || line[0] != '$')
            return -1;
        len = strtol(line + 1, NULL, 10);
        for (j = 0; j < len + 2; j++) { /* the bytes and their \r\n */
            int c = fgetc(f);
            if (c == EOF)
                return -1;
            if (i < 8 && j < 63 && j < len)
                argv[i][j] = (char)c;
        }
        if (i < 8)
            argv[i][len < 63 ? len : 63] = '\0';
    }
    return (int)n;
}

static void say(int fd, const char *text)
{
    size_t off = 0, len = strlen(text);

    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w <= 0)
            return;
        off += (size_t)w;
    }
}

/* Serve connections one after the other until killed (the parent kills it
 * at the end of the case; an alarm bounds it anyway). */
static void fake_serve(int lfd, fake_mode mode)
{
    int conn = 0;

    alarm(60);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        FILE *f;
        char argv[8][64];
        int argc;

        if (fd < 0)
            continue;
        conn++;
        f = fdopen(fd, "r");
        while (f && (argc = read_cmd(f, argv)) > 0) {
            if (strcasecmp(argv[0], "SCRIPT") == 0) {
                char r[64];
                snprintf(r, sizeof(r), "$40\r\n%s\r\n", sha40);
                say(fd, r);
            } else if (strcasecmp(argv[0], "CONFIG") == 0) {
                if (mode == FAKE_DROP_ON_CONFIG ||
                    (mode == FAKE_DROP_ON_RECONNECT_CONFIG && conn > 1))
                    break;
                say(fd, "*4\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n"
                        "$11\r\nappendfsync\r\n$6\r\nalways\r\n");
            } else if (strcasecmp(argv[0], "EVALSHA") == 0) {
                if (mode == FAKE_DROP_ON_RECONNECT_CONFIG)
                    break;
                if (mode == FAKE_ACQUIRE_STRINGS)
                    say(fd, "*2\r\n$1\r\nx\r\n$1\r\ny\r\n");
                else
                    say(fd, "*2\r\n:1\r\n$-1\r\n");
            } else if (strcasecmp(argv[0], "PING") == 0) {
                say(fd, "+PONG\r\n");
            } else {
                say(fd, "-ERR unknown command\r\n");
            }
        }
        if (f)
            fclose(f);
        else
            close(fd);
    }
}

typedef struct {
    pid_t pid;
    char url[64];
} fake_server;

static void fake_start(fake_server *fs, fake_mode mode)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(lfd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0; /* any free port */
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(lfd, 16), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
    snprintf(fs->url, sizeof(fs->url), "redis://127.0.0.1:%d", ntohs(a.sin_port));
    fflush(NULL);
    fs->pid = fork();
    assert_true(fs->pid >= 0);
    if (fs->pid == 0) {
        fake_serve(lfd, mode);
        _exit(0);
    }
    close(lfd);
}

static void fake_stop(fake_server *fs)
{
    kill(fs->pid, SIGKILL);
    waitpid(fs->pid, NULL, 0);
}

/* ---- the client side (in a child) ------------------------------------------ */

static const char *client_url;

/* Open, then acquire; report both codes. */
static void client_open_acquire(void *arg)
{
    lease_store *s = NULL;
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;
    lease_info h;
    int rc;

    (void)arg;
    lease_log_set(NULL, NULL, LEASE_LOG_OFF);
    rc = lease_store_open_timeout(&s, client_url, 2000);
    child_say("OPEN %d %s", rc, rc < 0 ? lease_errmsg() : "");
    if (rc < 0)
        return;
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 5000;
    memset(&g, 0, sizeof(g));
    rc = lease_acquire(&g, &h, s, "k", &o);
    child_say("ACQUIRE %d %llu %s", rc, (unsigned long long)g.token,
              rc < 0 ? lease_errmsg() : "");
    /* And once more on the same handle: after a dropped connection the
     * next call reconnects. */
    rc = lease_acquire(&g, &h, s, "k", &o);
    child_say("ACQUIRE %d %llu %s", rc, (unsigned long long)g.token,
              rc < 0 ? lease_errmsg() : "");
    lease_store_close(s);
}

/* The last case's report: freed by the teardown, also when an assertion
 * failed half-way. */
static char *report_of_case;

static int free_report(void **state)
{
    (void)state;
    free(report_of_case);
    report_of_case = NULL;
    return 0;
}

static char *run_client(fake_mode mode)
{
    fake_server fs;
    int status;
    char *report;

    fake_start(&fs, mode);
    client_url = fs.url;
    report = run_child(client_open_acquire, NULL, 30000, &status);
    fake_stop(&fs);
    assert_non_null(report);
    report_of_case = report;
    print_message("client report:\n%s", report);
    if (status != 0)
        fail_msg("the client %s (status %d); it said:\n%s",
                 status > 128 ? "was killed by a signal - the library crashed"
                              : "did not end normally",
                 status, report);
    return report;
}

/* The report's OPEN line: its code, and its message in msg. */
static int open_line(const char *report, char *msg, size_t size)
{
    const char *p = strstr(report, "OPEN ");
    const char *m, *end;

    if (p == NULL || (p != report && p[-1] != '\n'))
        fail_msg("the client did not report its open:\n%s", report);
    m = strchr(p + 5, ' ');
    end = strchr(p, '\n');
    if (m == NULL || end == NULL || m > end)
        fail_msg("unreadable OPEN line:\n%s", report);
    snprintf(msg, size, "%.*s", (int)(end - m - 1), m + 1);
    return atoi(p + 5);
}

/* The open succeeded, and there are exactly `count` ACQUIRE lines, each
 * with code `want`; returns the last one's message (in msg). */
static void expect_acquires(const char *report, int want, int count,
                            char *msg, size_t size)
{
    const char *p = report;
    int seen = 0, rc;

    if ((rc = open_line(report, msg, size)) != 0)
        fail_msg("open returned %s, expected OK: %s", lease_error_name(rc), msg);
    msg[0] = '\0';
    while (p && *p) {
        if (strncmp(p, "ACQUIRE ", 8) == 0) {
            const char *m = strchr(p + 8, ' '), *end = strchr(p, '\n');

            rc = atoi(p + 8);
            seen++;
            if (rc != want)
                fail_msg("acquire returned %s (%d), expected %s: %.200s",
                         lease_error_name(rc), rc, lease_error_name(want), p);
            /* "ACQUIRE <rc> <token> <message>" */
            if (m != NULL && (m = strchr(m + 1, ' ')) != NULL && end != NULL && m < end)
                snprintf(msg, size, "%.*s", (int)(end - m - 1), m + 1);
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (seen != count)
        fail_msg("%d acquire(s) reported, expected %d:\n%s", seen, count, report);
}

/* The connection dies while the store checks the server's durability
 * settings (CONFIG GET, right after the scripts were loaded on a new
 * connection): the call that was connecting ends with ESTORE naming the
 * check, never with success on a connection that is gone. The check runs
 * on every new connection until it has warned once (the fake server's
 * settings are good, so it never warns), so it is seen twice: in the open
 * (the server always drops there; the client stops after the failed open),
 * and in the acquire that reconnects after a drop. */
static void test_drop_during_durability_check(void **state)
{
    char msg[512];
    char *report = run_client(FAKE_DROP_ON_CONFIG);
    int rc;

    (void)state;
    if ((rc = open_line(report, msg, sizeof(msg))) != LEASE_ESTORE)
        fail_msg("open returned %s, expected ESTORE: %s", lease_error_name(rc), msg);
    if (strstr(msg, "config get") == NULL)
        fail_msg("the open failed, but not in the durability check: %s", msg);
    if (strstr(report, "ACQUIRE ") != NULL)
        fail_msg("the client went on after a failed open:\n%s", report);
    free(report);
    report_of_case = NULL;

    /* Open on a good connection; the first acquire loses it (the server
     * hangs up on EVALSHA), the second reconnects and loses the new
     * connection in the check. */
    report = run_client(FAKE_DROP_ON_RECONNECT_CONFIG);
    expect_acquires(report, LEASE_ESTORE, 2, msg, sizeof(msg));
    if (strstr(msg, "config get") == NULL)
        fail_msg("the second acquire failed, but not in the durability "
                 "check: %s\nreport:\n%s", msg, report);
}

/* The acquire script's answer has the right length but wrong types. */
static void test_acquire_answer_of_strings(void **state)
{
    char msg[512];
    char *report = run_client(FAKE_ACQUIRE_STRINGS);

    (void)state;
    expect_acquires(report, LEASE_ESTORE, 2, msg, sizeof(msg));
}

/* The acquire script says "granted" without a token. */
static void test_acquire_answer_without_token(void **state)
{
    char msg[512];
    char *report = run_client(FAKE_ACQUIRE_NIL_TOKEN);

    (void)state;
    expect_acquires(report, LEASE_ESTORE, 2, msg, sizeof(msg));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_drop_during_durability_check, free_report),
        cmocka_unit_test_teardown(test_acquire_answer_of_strings, free_report),
        cmocka_unit_test_teardown(test_acquire_answer_without_token, free_report),
    };

    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
