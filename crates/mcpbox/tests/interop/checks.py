"""What every interop client script reports with: one line per check, and
the text of a tool result."""
import sys


def check(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok   {what}", flush=True)


def text_of(result):
    return "\n".join(getattr(c, "text", "") or "" for c in result.content)
