/*
 * etcd/pb.h - etcd's gRPC API for the etcd store (stores/etcd/etcd.c), as the
 * JSON gateway's shapes: a request the store built as the gateway's JSON
 * becomes the protobuf message etcd's gRPC server takes, and the message
 * it answers becomes the JSON the gateway would have answered (int64 as
 * decimal strings, bytes as base64, enums by name, default values left
 * out, a stream's message under "result"). So the store's logic is one,
 * whatever the transport; only etcd's answers over gRPC skip the gateway,
 * which costs etcd a JSON decode, an in-process gRPC call and a JSON
 * encode per request (docs/benchmarks.md).
 *
 * The codec knows the messages of the calls the store makes, field by
 * field (the numbers of etcd's rpc.proto and kv.proto); an answer is input
 * from the network: every length is checked against what is left, depth
 * and sizes are bounded, a wire type that does not match the field's is
 * refused, unknown fields are skipped, and for a field sent twice the
 * last value wins (a message field merges), as protobuf says.
 */
#ifndef LEASE_ETCD_PB_H
#define LEASE_ETCD_PB_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "stores/json_budget.h"

/* The gRPC method ("/etcdserverpb.KV/Txn") of a call the store makes at
 * gateway path `path` ("/v3/kv/txn"); NULL for one that stays on the
 * gateway (the watch). */
const char *lease__etcd_pb_method(const char *path);

/*
 * The body of the gRPC request for the gateway request `req` to `path`:
 * one length-prefixed message, malloc'ed into *out (*len bytes). 0, or -1
 * with the reason in err (a field the codec does not know: a bug).
 */
int lease__etcd_pb_request(unsigned char **out, size_t *len, const char *path,
                           json_t *req, char *err, size_t errsize);

/*
 * The gateway's JSON for the body of etcd's gRPC answer to a call to
 * `path`: exactly one uncompressed length-prefixed message. 0 and *out;
 * -1 with what is wrong with it in err (one past the budget's memory
 * among them); LEASE__JSON_LATE (err says so) when the budget's deadline
 * passed while it was decoded.
 */
int lease__etcd_pb_answer(json_t **out, const char *path, const unsigned char *body,
                          size_t len, const lease__json_budget *budget, char *err,
                          size_t errsize);

/* An int64 field of the gateway's JSON: proto3's JSON mapping writes them
 * as strings of digits; a JSON integer is taken too. 0, or -1 (and *out
 * 0) when it is neither. */
int lease__etcd_json_int(int64_t *out, json_t *v);

/* The text of a grpc-message header, percent-decoded: *len bytes, any
 * byte among them (NUL too), then a NUL; malloc'ed, NULL when out of
 * memory. Look for credentials in it before lease__etcd_pb_printable. */
char *lease__etcd_pb_message(const char *text, size_t n, size_t *len);

/* Control bytes (NUL among them) of msg's len bytes as '?', for a message. */
void lease__etcd_pb_printable(char *msg, size_t len);

/* Base64 (RFC 4648, padded), as the gateway writes bytes fields. */
char *lease__etcd_b64_encode(const void *data, size_t n);
/* NULL when `in` is not base64 (or out of memory); *len the bytes. */
char *lease__etcd_b64_decode(const char *in, size_t *len);
/* 1 when `t` (n bytes) is base64 padded to whole quads, as etcd writes it. */
int lease__etcd_b64_valid(const char *t, size_t n);

#endif
