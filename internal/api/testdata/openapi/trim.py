#!/usr/bin/env python3
"""Regenerates the trimmed OpenAPI specifications the conformance test
validates against (internal/api/conformance_test.go): each spec's info and
the components.schemas reachable from the roots below, nothing else
(OpenAI's whole spec is 3.4 MB), without descriptions and examples, and
OpenAPI 3.0's "nullable: true" (which OpenAI's 3.1 spec still uses in
places) said as 3.1 says it: "null" among the types (and the enum). See README.md for where the specs came
from.

    python3 trim.py openai    /path/to/openai-openapi/openapi.json  > openai.json
    python3 trim.py anthropic /path/to/anthropic-openapi-spec/hosted_spec.json > anthropic.json
"""
import json
import sys

ROOTS = {
    "openai": [
        "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "ErrorResponse",
        "Response", "ResponseCreatedEvent", "ResponseInProgressEvent", "ResponseOutputItemAddedEvent",
        "ResponseOutputItemDoneEvent", "ResponseContentPartAddedEvent", "ResponseContentPartDoneEvent",
        "ResponseTextDeltaEvent", "ResponseTextDoneEvent", "ResponseRefusalDeltaEvent", "ResponseRefusalDoneEvent",
        "ResponseFunctionCallArgumentsDeltaEvent", "ResponseFunctionCallArgumentsDoneEvent",
        "ResponseCompletedEvent", "ResponseIncompleteEvent", "ResponseFailedEvent",
    ],
    "anthropic": [
        "Message", "ErrorResponse", "MessageStartEvent", "ContentBlockStartEvent", "ContentBlockDeltaEvent",
        "ContentBlockStopEvent", "MessageDeltaEvent", "MessageStopEvent",
    ],
}


def refs(node, out):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/components/schemas/"):
            out.add(r.rsplit("/", 1)[1])
        for v in node.values():
            refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)


ANNOTATIONS = ("description", "examples", "example", "x-oaiMeta", "x-stainless-naming")


def strip(node):
    """Drops what validation does not read (descriptions, examples) from a
    schema; a "properties" map's keys are property names, kept."""
    if isinstance(node, list):
        return [strip(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ANNOTATIONS or k == "nullable":
            continue
        if k == "properties" and isinstance(v, dict):
            out[k] = {name: strip(prop) for name, prop in v.items()}
        else:
            out[k] = strip(v)
    if node.get("nullable") is True:
        # OpenAPI 3.0's nullable, which OpenAI's 3.1 spec still uses in
        # places and JSON Schema 2020-12 does not know: said in 3.1's terms.
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
        elif isinstance(t, list) and "null" not in t:
            out["type"] = t + ["null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = out["enum"] + [None]
        if "type" not in out and "$ref" not in out:
            pass
        elif "type" not in out:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def main():
    name, path = sys.argv[1], sys.argv[2]
    spec = json.load(open(path))
    schemas = spec["components"]["schemas"]
    keep, todo = set(), list(ROOTS[name])
    while todo:
        s = todo.pop()
        if s in keep:
            continue
        keep.add(s)
        found = set()
        refs(schemas[s], found)
        todo.extend(found - keep)
    out = {
        "openapi": spec["openapi"],
        "info": spec["info"],
        "paths": {},
        "components": {"schemas": {k: strip(schemas[k]) for k in sorted(keep)}},
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


main()
