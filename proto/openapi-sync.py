#!/usr/bin/env python3
"""Copies the bus's JSON Schemas into proto/openapi.json's components (those the gateway's HTTP
API shares with the bus), rewriting their references. Run it after changing a schema in
proto/schemas; `swift test --filter GatewayTests` fails until the copies agree."""
import json, os, re

HERE = os.path.dirname(os.path.abspath(__file__))  # proto/ (openapi.json is a link to the gateway's resource)
SCHEMAS = os.path.join(HERE, "schemas")
# component name -> (schema file, $defs name or None)
SHARED = {
    "Uid": ("common.schema.json", "Uid"),
    "Timestamp": ("common.schema.json", "Timestamp"),
    "Provider": ("common.schema.json", "Provider"),
    "UsernameProblem": ("common.schema.json", "UsernameProblem"),
    "RouteIntentKind": ("common.schema.json", "RouteIntentKind"),
    "RouteIntentReason": ("common.schema.json", "RouteIntentReason"),
    "ImagePath": ("common.schema.json", "ImagePath"),
    "Profile": ("common.schema.json", "Profile"),
    "SignInRequest": ("auth.signIn.schema.json", None),
    "SignInResult": ("auth.signIn.reply.schema.json", None),
    "AccountResult": ("auth.withdraw.reply.schema.json", None),
    "ProfileResult": ("profile.get.reply.schema.json", None),
    "UsernameAvailability": ("profile.checkUsername.reply.schema.json", None),
    "OnboardingStatus": ("onboarding.check.reply.schema.json", None),
    "RouteState": ("onboarding.intent.reply.schema.json", None),
    "RouteIntent": ("route.intent.schema.json", None),
}
FILES = {file: name for name, (file, definition) in SHARED.items() if definition is None}


def rewrite(node):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in ("$schema", "$id"):
                continue
            if key == "$ref":
                match = re.fullmatch(r"common\.schema\.json#/\$defs/(\w+)", value)
                if match:
                    value = "#/components/schemas/" + match.group(1)
                elif value in FILES:
                    value = "#/components/schemas/" + FILES[value]
                else:
                    raise SystemExit(f"no component for the reference {value}; add it to SHARED")
            out[key] = rewrite(value)
        return out
    if isinstance(node, list):
        return [rewrite(item) for item in node]
    return node


def shared_components():
    components = {}
    for name, (file, definition) in SHARED.items():
        with open(os.path.join(SCHEMAS, file)) as handle:
            schema = json.load(handle)
        if definition:
            schema = schema["$defs"][definition]
        component = rewrite(schema)
        component["x-bus-schema"] = file + (f"#/$defs/{definition}" if definition else "")
        components[name] = component
    return components


if __name__ == "__main__":
    path = os.path.join(HERE, "openapi.json")
    with open(path) as handle:
        document = json.load(handle)
    schemas = document["components"]["schemas"]
    own = {name: value for name, value in schemas.items() if "x-bus-schema" not in value}
    document["components"]["schemas"] = {**own, **shared_components()}
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    print(f"{path}: {len(SHARED)} components copied from proto/schemas")
