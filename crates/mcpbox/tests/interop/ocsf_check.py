"""Validates `mcpbox audit --ocsf` output against the OCSF 1.5.0 schema.

usage: ocsf_check.py < events.jsonl

Each line must be a valid event of its class (API Activity or Network
Activity), checked with the class's JSON Schema as ocsf-json-schema
generates it from the schema it ships (no network). Prints one line per
class with how many events were valid; any invalid event exits 1 with the
reason.
"""
import json
import sys
from collections import Counter

import jsonschema
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

CLASSES = {6003: "api_activity", 4001: "network_activity"}

schema = OcsfJsonSchemaEmbedded(get_ocsf_schema(version="1.5.0"))
validators = {}
seen = Counter()
for n, line in enumerate(sys.stdin, 1):
    event = json.loads(line)
    uid = event.get("class_uid")
    if uid not in CLASSES:
        print(f"line {n}: class_uid {uid} is not one mcpbox exports", file=sys.stderr)
        sys.exit(1)
    if uid not in validators:
        cls = schema.get_class_schema(CLASSES[uid])
        validators[uid] = jsonschema.Draft202012Validator(cls)
    errors = sorted(validators[uid].iter_errors(event), key=lambda e: list(e.path))
    if errors:
        for e in errors[:5]:
            print(f"line {n} ({CLASSES[uid]}): {'/'.join(map(str, e.path))}: {e.message}", file=sys.stderr)
        sys.exit(1)
    seen[CLASSES[uid]] += 1
for name, count in sorted(seen.items()):
    print(f"{name} {count} valid")
