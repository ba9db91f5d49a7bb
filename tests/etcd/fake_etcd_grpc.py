#!/usr/bin/env python3
"""fake_etcd_grpc.py - a broken or hostile "etcd" speaking gRPC on
127.0.0.1 (python3-grpcio), for the tests of what the etcd store does over
gRPC with answers it must not trust. Never a stand-in for etcd's
behaviour: the real store tests run against real members.

    fake_etcd_grpc.py PORTFILE MODE [ARG...]

It listens on a free loopback port, writes it to PORTFILE, and serves
until killed or for LIFETIME seconds (bounded). Every method is served as
raw bytes: the answers are written here byte by byte, whatever etcd's
protobuf messages would allow.

MODES
  silent          takes each call and never answers
  huge            answers every call with one message of 64 MiB
  bytes HEX       answers every call with the message HEX (hex digits:
                  protobuf as it comes, well-formed or not)
  abort CODE MSG  refuses every call with gRPC status CODE (a number) and
                  message MSG
  authfail MSG    answers a range read (the store's open) as etcd would,
                  refuses Authenticate with UNAUTHENTICATED and MSG
  tokenecho TOKEN answers Authenticate with the auth token TOKEN, then
                  refuses every other call with a message that repeats it
  txnempty BYTES  answers a range read (the store's open) as etcd would, and
                  every Txn with a message of BYTES bytes of empty answers
                  (each "1a021200": an op whose put answer is empty), 4
                  bytes each that a decoder may make two objects of
  rangebig BYTES  answers every range read with a message of BYTES bytes of
                  key-values that hold a version only (each "12022001")
"""
import os
import sys
import threading
import time
from concurrent import futures

import grpc

LIFETIME = 120
# A RangeResponse with header {revision: 1}: what etcd answers a count.
RANGE_OK = bytes.fromhex("0a021801")


def answer_for(mode, args):
    if mode == "silent":
        def fn(req, ctx):
            time.sleep(LIFETIME)
            return b""
    elif mode == "huge":
        blob = b"\x0a" + b"\x80\x80\x80\x20" + b"\x00" * (64 << 20)

        def fn(req, ctx):
            return blob
    elif mode == "bytes":
        msg = bytes.fromhex(args[0])

        def fn(req, ctx):
            return msg
    elif mode in ("txnempty", "rangebig"):
        unit = bytes.fromhex("1a021200" if mode == "txnempty" else "12022001")
        blob = unit * (int(args[0]) // len(unit))

        def fn(req, ctx):
            return blob
    elif mode == "abort":
        code = {c.value[0]: c for c in grpc.StatusCode}[int(args[0])]

        def fn(req, ctx):
            ctx.abort(code, args[1])
    elif mode == "authfail":
        def fn(req, ctx):
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, args[0])
    elif mode == "tokenecho":
        def fn(req, ctx):
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "token %s is not allowed" % args[0])
    else:
        sys.exit("fake_etcd_grpc.py: unknown mode " + mode)
    return fn


class Handler(grpc.GenericRpcHandler):
    def __init__(self, mode, args):
        self.mode = mode
        self.args = args
        self.fn = answer_for(mode, args)

    def service(self, details):
        fn = self.fn
        if (self.mode == "authfail" and details.method != "/etcdserverpb.Auth/Authenticate") or \
                (self.mode == "txnempty" and details.method != "/etcdserverpb.KV/Txn"):
            def fn(req, ctx):
                return RANGE_OK
        if self.mode == "tokenecho" and details.method == "/etcdserverpb.Auth/Authenticate":
            token = self.args[0].encode()

            def fn(req, ctx, token=token):
                return b"\x12" + bytes([len(token)]) + token
        if details.method.endswith("/LeaseKeepAlive") or details.method.endswith("/Watch"):
            def stream(reqs, ctx, fn=fn):
                for req in reqs:
                    yield fn(req, ctx)
            return grpc.stream_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(fn)


def main():
    portfile, mode, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         handlers=[Handler(mode, args)],
                         options=[("grpc.max_send_message_length", -1)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
    os.rename(tmp, portfile)
    threading.Timer(LIFETIME, lambda: os._exit(0)).start()
    server.wait_for_termination(LIFETIME)


if __name__ == "__main__":
    main()
