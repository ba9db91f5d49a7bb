/*
 * pg_store_security.c - no password in any message, whatever is wrong with
 * the URL, and keys with every awkward byte stored, listed and released
 * as they are.
 */
#include "pg_store.h"

/* ======================================================================
 * security: passwords, hostile keys
 * ====================================================================== */

void test_security_no_password(void **state)
{
    static const char wrong[] = "Wr0ngPassw0rd-93f1";
    char *real = url_password(conf_url), *bad, *u;
    lease_store *s = NULL;
    const char *auth;
    char multi[512], hostport[128];

    (void)state;
    /* The handle's redacted URL. */
    assert_non_null(strstr(lease_store_url_redacted(conf_store), "***"));
    ASSERT_NO_SECRET(lease_store_url_redacted(conf_store), real);

    /* Wrong password: ESTORE, "***" in place of the password. */
    bad = url_replace_password(conf_url, wrong);
    CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, bad));
    assert_null(s);
    printf("# wrong password: %s\n", lease_errmsg());
    ASSERT_NO_SECRET(lease_errmsg(), wrong);
    ASSERT_NO_SECRET(lease_errmsg(), real);
    assert_non_null(strstr(lease_errmsg(), "***"));
    CHECK_FAIL(LEASE_ESTORE, lease_store_open_timeout(&s, bad, 800));
    ASSERT_NO_SECRET(lease_errmsg(), wrong);

    /* A password given as a libpq parameter is hidden as well. */
    {
        char nopw[512], *q;
        const char *at;
        /* postgres://lease@host:port/lease?password=wrong */
        auth = strstr(conf_url, "://") + 3;
        at = strchr(auth, '@');
        if (at) {
            const char *colon = memchr(auth, ':', (size_t)(at - auth));
            snprintf(nopw, sizeof(nopw), "%.*s%s",
                     (int)((colon ? colon : at) - conf_url), conf_url, at);
        } else {
            snprintf(nopw, sizeof(nopw), "%s", conf_url);
        }
        q = url_with(nopw, "password=Wr0ngPassw0rd-93f1&sslmode=disable");
        CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, q));
        printf("# wrong password as a parameter: %s\n", lease_errmsg());
        ASSERT_NO_SECRET(lease_errmsg(), wrong);
        free(q);
        if (real[0]) {
            /* the right one as a parameter opens, and is not shown */
            char pw[160];
            snprintf(pw, sizeof(pw), "password=%s", real);
            q = url_with(nopw, pw);
            CHECK_RC(0, lease_store_open(&s, q));
            ASSERT_NO_SECRET(lease_store_url_redacted(s), real);
            lease_store_close(s);
            s = NULL;
            free(q);
        }
    }

    /* Several hosts (as for a failover pair), wrong password. */
    auth = strstr(bad, "@") + 1;
    snprintf(hostport, sizeof(hostport), "%.*s", (int)strcspn(auth, "/?"), auth);
    snprintf(multi, sizeof(multi), "%.*s%s,%s%s", (int)(auth - bad), bad, hostport,
             hostport, auth + strlen(hostport));
    u = url_with(multi, "target_session_attrs=read-write");
    CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, u));
    printf("# wrong password, two hosts: %s\n", lease_errmsg());
    ASSERT_NO_SECRET(lease_errmsg(), wrong);
    assert_non_null(strstr(lease_errmsg(), "***"));
    free(u);

    /* A password with escaped characters: neither form shows. */
    {
        char *esc = url_replace_password(conf_url, "Wr%40ng%3Apw%2Fx");
        CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, esc));
        ASSERT_NO_SECRET(lease_errmsg(), "Wr%40ng%3Apw%2Fx");
        ASSERT_NO_SECRET(lease_errmsg(), "Wr@ng:pw/x");
        free(esc);
    }
    free(bad);
    free(real);

    /* An '@' the user did not escape: lease reads the password up to the
     * last '@' (src/util/url.c is lenient there), so all of it is the password
     * and no part of it may show, whatever libpq makes of the URL. */
    {
        char *raw_at = url_replace_password(conf_url, "Wr0ng@Tail-5150");
        char msg[1024];
        int rc;
        lease_error_clear();
        rc = lease_store_open(&s, raw_at);
        snprintf(msg, sizeof(msg), "%s", lease_errmsg());
        free(raw_at);
        printf("# a password with an unescaped '@': %s\n", msg);
        assert_int_not_equal(rc, 0);
        ASSERT_NO_SECRET(msg, "Wr0ng@Tail-5150");
        ASSERT_NO_SECRET(msg, "Tail-5150");
        ASSERT_NO_SECRET(msg, "Wr0ng");
    }
}

static int walk_found;

void test_security_hostile_keys(void **state)
{
    static const char *const names[] = {
        "x'); DROP TABLE coordination_lease; --",
        "'; DROP TABLE lease_fence; --",
        "a'b\"c;d\\e",
        "back\\\\slash\\",
        "semi;colon;;",
        "100%_like_%",
        "$1 $2::uuid ?",
        "tab\tnew\nline",
        "\xff\xfe not utf-8 '; --",
        "\xef\xbf\xbfstarts with U+FFFF",
        "E'\\x00' \\0",
    };
    char a[LEASE_OWNER_BUFSZ], key[LEASE_KEY_MAX + 1], prefix[LEASE_KEY_MAX + 1];
    lease_grant g;
    lease_info info, *list;
    size_t i, n, j;
    uint64_t mark, tok;
    void *val;
    size_t len;
    PGconn *c;
    char *v;

    (void)state;
    conf_owner(a);
    conf_key(prefix, "hostile/");
    c = raw_connect(conf_url);
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char label[LEASE_LABEL_MAX + 1];
        const char value[] = "v'al\0ue\\;";

        conf_key(key, "hostile/");
        strncat(key, names[i], LEASE_KEY_MAX - strlen(key));
        snprintf(label, sizeof(label), "label %s", names[i]);
        g = conf_acquire(key, a, 30000, label);
        CHECK_RC(0, lease_inspect(&info, conf_store, key));
        assert_string_equal(info.key, key);
        assert_string_equal(info.label, label);
        assert_int_equal(info.held, 1);
        CHECK_RC(0, lease_fence_advance(&mark, conf_store, key, g.token));
        CHECK_RC(0, lease_fence_mark(&mark, conf_store, key));
        ASSERT_U64_OP(mark, ==, g.token);
        CHECK_RC(0, lease_guarded_put(conf_store, &g, key, value, sizeof(value)));
        CHECK_RC(0, lease_data_get(&val, &len, &tok, conf_store, key));
        assert_int_equal(len, sizeof(value));
        assert_memory_equal(val, value, sizeof(value));
        ASSERT_U64_OP(tok, ==, g.token);
        free(val);
        /* A UTF-8 key is stored as it is (the reference SQL finds it);
         * PostgreSQL text cannot hold the others at all. */
        if (names[i][0] != '\xff') {
            const char *kv[1] = { key };
            assert_int_equal(raw_ll(c, "SELECT count(*) FROM coordination_lease "
                                       "WHERE resource_key = $1", 1, kv), 1);
        }
    }
    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    assert_int_equal(n, sizeof(names) / sizeof(names[0]));
    walk_found = 0;
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        conf_key(key, "hostile/");
        strncat(key, names[i], LEASE_KEY_MAX - strlen(key));
        for (j = 0; j < n; j++)
            if (strcmp(list[j].key, key) == 0) {
                walk_found++;
                assert_int_equal(list[j].held, 1);
                assert_string_equal(list[j].owner, a);
                CHECK_RC(0, lease_grant_init(&g, key, a, list[j].token, 30000));
            }
        CHECK_RC(0, lease_release(conf_store, &g));
    }
    assert_int_equal(walk_found, (int)(sizeof(names) / sizeof(names[0])));
    lease_list_free(list);

    /* A key that starts with U+FFFF (the store's escape mark for names
     * that are not UTF-8) reads back exactly, and lists under its prefix. */
    snprintf(key, sizeof(key), "\xef\xbf\xbf%sstarts-with-the-mark", conf_prefix);
    snprintf(prefix, sizeof(prefix), "\xef\xbf\xbf%s", conf_prefix);
    g = conf_acquire(key, a, 30000, "\xef\xbf\xbf label");
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_string_equal(info.key, key);
    assert_string_equal(info.label, "\xef\xbf\xbf label");
    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    assert_int_equal(n, 1);
    assert_string_equal(list[0].key, key);
    lease_list_free(list);
    CHECK_RC(0, lease_release(conf_store, &g));
    /* Every table is still there. */
    v = raw_scalar(c, "SELECT (to_regclass('coordination_lease') IS NOT NULL "
                      "AND to_regclass('lease_fence') IS NOT NULL "
                      "AND to_regclass('lease_data') IS NOT NULL)::text", 0, NULL);
    assert_string_equal(v, "true");
    free(v);
    PQfinish(c);
}
