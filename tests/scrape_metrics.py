#!/usr/bin/python3
"""Scrapes a stagefs /metrics URL and parses it with the Prometheus
client's own text-format parser (prometheus_client.parser), as a Prometheus
server would read it. Prints JSON: {"content_type": ..., "families":
{name: type}, "samples": [[name, labels, value], ...]}. Exits 1 with a
message when the page cannot be fetched or parsed. Used by tests/metrics.rs.
"""
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main():
    url = sys.argv[1]
    with urllib.request.urlopen(url, timeout=10) as r:
        content_type = r.headers.get("Content-Type", "")
        text = r.read().decode("utf-8")
    families = {}
    samples = []
    for family in text_string_to_metric_families(text):
        if family.name in families:
            raise ValueError(f"family {family.name} appears twice")
        families[family.name] = family.type
        for s in family.samples:
            samples.append([s.name, s.labels, s.value])
    json.dump(
        {"content_type": content_type, "families": families, "samples": samples},
        sys.stdout,
        allow_nan=False,
    )


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints this
        print(f"scrape_metrics: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
