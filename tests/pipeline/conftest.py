"""One Spark session for every Spark test of the run: starting one takes seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from tickwheel.pipeline.spark import spark_session

    session = spark_session("local[2]", app_name="tickwheel-tests", driver_memory="2g")
    yield session
    session.stop()
