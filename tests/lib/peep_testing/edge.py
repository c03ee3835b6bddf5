"""What the edge agent's tests share: the site their agents publish under on the shared broker.

One site per test process: under pytest-xdist several workers use the broker on 127.0.0.1:1883 at once,
and a worker that clears the retained statuses it left at its end must not clear another worker's.
"""

from __future__ import annotations

import uuid

#: The site (and so the topic level ``peep/v1/<site>/...``) of this process's agents on the shared broker.
EDGE_SITE = f"edgetest-{uuid.uuid4().hex[:8]}"
