"""Jinja2 templates of the Kubernetes objects, one file per object kind (packaged in the wheel).

Rules: `StrictUndefined`; every value goes through `|tojson` (JSON is valid YAML, so no value can
add or change a YAML key); the result is parsed with `yaml.safe_load` by `submitter.render`.
"""

from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent
