#!/usr/bin/env python3
"""A client written only from proto/README.md: drives the whole onboarding journey.

Needs pyzmq (pip install pyzmq). Endpoints come from the same environment variables the
services use, with the same defaults. Exits 0 when every step behaved as proto/ says.

The bus is encrypted (CURVE): the client loads its own key pair (NAME.key_secret) and each
server's public key (auth.key, profile.key, ...) from the keys directory, made with
`onboarding-keys make NAME`. ONBOARDING_CURVE=false talks plain ZeroMQ to a system run so.
"""
import datetime
import json
import os
import struct
import sys
import uuid
import zlib

import zmq

AUTH = os.environ.get("ONBOARDING_AUTH_RPC", "tcp://127.0.0.1:7101")
PROFILE = os.environ.get("ONBOARDING_PROFILE_RPC", "tcp://127.0.0.1:7201")
ORCHESTRATOR = os.environ.get("ONBOARDING_ORCHESTRATOR_RPC", "tcp://127.0.0.1:7401")
ROUTES = os.environ.get("ONBOARDING_ROUTES", "tcp://127.0.0.1:7402")
DATA_DIR = os.environ.get("ONBOARDING_DATA_DIR", ".data")
KEYS_DIR = os.environ.get("ONBOARDING_KEYS_DIR") or os.path.join(DATA_DIR, "keys")
KEY_NAME = os.environ.get("ONBOARDING_KEY_NAME", "client")
CURVE = os.environ.get("ONBOARDING_CURVE", "true").lower() not in ("0", "false", "no", "off")
# Which server holds each endpoint: its public key is <name>.key in the keys directory.
SERVER_OF = {AUTH: "auth", PROFILE: "profile", ORCHESTRATOR: "orchestrator", ROUTES: "orchestrator"}


def png(width, height, rgb=(40, 120, 200)):
    """A whole PNG of one colour: image-upload decodes every image, so a bare header is refused."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = png(32, 32)

ctx = zmq.Context.instance()


def connect(sock, endpoint):
    """Connects `sock`, as a CURVE client of the server at `endpoint` unless CURVE is off."""
    if CURVE:
        import zmq.auth
        public, secret = zmq.auth.load_certificate(os.path.join(KEYS_DIR, KEY_NAME + ".key_secret"))
        server, _ = zmq.auth.load_certificate(os.path.join(KEYS_DIR, SERVER_OF[endpoint] + ".key"))
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    sock.connect(endpoint)


class ServiceError(Exception):
    def __init__(self, payload):
        super().__init__(f"{payload['code']} ({payload.get('reason')}): {payload['message']}")
        self.code, self.reason = payload["code"], payload.get("reason")


def envelope(type_, payload, session_token=None):
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
    env = {"version": 1, "id": str(uuid.uuid4()), "type": type_, "source": "python-client",
           "sequence": 0, "time": now.replace("+00:00", "Z"), "payload": payload}
    if session_token:
        env["sessionToken"] = session_token
    return env


def call(endpoint, type_, payload, session_token=None, image=None, timeout_ms=5000):
    """One request on a REQ socket: returns the reply payload or raises ServiceError."""
    request = envelope(type_, payload, session_token)
    frames = [json.dumps(request).encode()] + ([image] if image is not None else [])
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    connect(sock, endpoint)
    try:
        sock.send_multipart(frames)
        if not sock.poll(timeout_ms):
            raise TimeoutError(f"{type_}: no reply from {endpoint}")
        reply = json.loads(sock.recv())
    finally:
        sock.close()
    assert reply["correlationId"] == request["id"], reply
    if reply["type"] == "error":
        raise ServiceError(reply["payload"])
    assert reply["type"] == type_ + ".reply", reply
    return reply["payload"]


def expect_error(code, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except ServiceError as error:
        assert error.code == code, f"expected {code}, got {error}"
        return error
    raise AssertionError(f"expected {code}, but the call succeeded")


def subscribe(topic):
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    connect(sub, ROUTES)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    return sub


def wait_for(sub, uid, intent, timeout_ms=5000):
    """Reads route intents until `intent` for `uid` arrives."""
    while sub.poll(timeout_ms):
        topic, body = sub.recv_multipart()
        event = json.loads(body)
        assert topic.decode() == "route." + event["uid"] and event["type"] == "route.intent", event
        if event["uid"] == uid and event["payload"]["intent"] == intent:
            return event
    raise AssertionError(f"no {intent} for {uid}")


def main():
    tap = subscribe("route.")
    # Pub/sub only delivers once the subscription has reached the publisher: a warm-up person
    # asks "check me now" until one of their intents arrives.
    warm = call(AUTH, "auth.signIn", {"provider": "google", "subject": "py-warm-" + uuid.uuid4().hex})
    for _ in range(100):
        call(ORCHESTRATOR, "onboarding.check", {}, warm["sessionToken"])
        if tap.poll(50):
            break
    else:
        raise AssertionError("the route topic never delivered")

    subject, username = "py-" + uuid.uuid4().hex, "py" + uuid.uuid4().hex[:6]
    me = call(AUTH, "auth.signIn", {"provider": "naver", "subject": subject})
    uid, token = me["uid"], me["sessionToken"]
    assert me["isNewAccount"] is True
    print("signed in", uid)
    wait_for(tap, uid, "presentProfileSetup")
    print("presentProfileSetup")

    status = call(ORCHESTRATOR, "onboarding.check", {}, token)
    assert status == {"uid": uid, "hasProfile": False, "intent": "presentProfileSetup"}, status
    assert "profile" not in call(PROFILE, "profile.get", {}, token)
    assert call(PROFILE, "profile.checkUsername", {"username": username})["available"] is True
    assert call(PROFILE, "profile.checkUsername", {"username": "a"})["reason"] == "tooShort"

    error = expect_error("invalidUsername", call, ORCHESTRATOR, "onboarding.setUpProfile", {"username": "no way"}, token)
    assert error.reason == "invalidCharacters"
    error = expect_error("imageRejected", call, ORCHESTRATOR, "onboarding.setUpProfile",
                         {"username": username, "contentType": "image/png"}, token, image=b"GIF89a fake")
    assert error.reason == "unsupportedType"
    error = expect_error("imageRejected", call, ORCHESTRATOR, "onboarding.setUpProfile",
                         {"username": username, "contentType": "image/png"}, token, image=PNG[:8])
    assert error.reason == "invalidImage"
    expect_error("unauthenticated", call, ORCHESTRATOR, "onboarding.check", {}, "not-a-token")

    # A DEALER socket: own routing frame, empty delimiter, envelope, image.
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    connect(dealer, ORCHESTRATOR)
    request = envelope("onboarding.setUpProfile", {"username": username, "contentType": "image/png"}, token)
    dealer.send_multipart([b"setup-1", b"", json.dumps(request).encode(), PNG])
    assert dealer.poll(5000), "no reply to the set-up"
    tag, empty, body = dealer.recv_multipart()
    reply = json.loads(body)
    assert (tag, empty, reply["type"], reply["correlationId"]) == (b"setup-1", b"", "onboarding.setUpProfile.reply", request["id"]), reply
    profile = reply["payload"]["profile"]
    assert profile["username"] == username and profile["imagePath"].startswith(uid + "/"), profile
    dealer.close()
    wait_for(tap, uid, "dismiss")
    print("dismiss")

    assert call(PROFILE, "profile.get", {}, token)["profile"] == profile
    assert call(PROFILE, "profile.checkUsername", {"username": username.upper()})["reason"] == "duplicated"

    assert call(AUTH, "auth.signOut", {}, token) == {"uid": uid}
    expect_error("unauthenticated", call, ORCHESTRATOR, "onboarding.check", {}, token)
    again = call(AUTH, "auth.signIn", {"provider": "naver", "subject": subject})
    assert again["uid"] == uid and again["isNewAccount"] is False
    assert call(ORCHESTRATOR, "onboarding.check", {}, again["sessionToken"])["hasProfile"] is True
    print("signed in again: nothing to show")

    assert call(AUTH, "auth.withdraw", {}, again["sessionToken"]) == {"uid": uid}
    for _ in range(200):
        if call(PROFILE, "profile.checkUsername", {"username": username})["available"]:
            break
        tap.poll(10)
    else:
        raise AssertionError("the username of a withdrawn person was never freed")
    print("withdrawn: username free again")
    print("python client: all steps passed")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, ServiceError, TimeoutError) as failure:
        print("python client failed:", failure, file=sys.stderr)
        sys.exit(1)
