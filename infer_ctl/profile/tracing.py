"""router.tracing: OpenTelemetry traces of the router's requests (docs/observability.md).

Off unless configured: `enabled: true`, or an endpoint here or in the standard environment
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT). Exporter headers are read only from
the environment (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS): they usually carry an API key, and a profile is
a file people commit and share.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from infer_ctl.profile.base import StrictModel


class TracingSettings(StrictModel):
    #: None: on when an OTLP endpoint is configured (here or in the environment); false: never
    enabled: bool | None = None
    #: OTLP endpoint: gRPC `http://collector:4317`; HTTP `http://collector:4318` (`/v1/traces` appended
    #: when the URL has no path). None: the exporter's OTEL_EXPORTER_OTLP_* environment variables.
    endpoint: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$")] | None = None
    #: None: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf (the
    #: OpenTelemetry specification's default)
    protocol: Literal["grpc", "http/protobuf"] | None = None
    #: None: OTEL_SERVICE_NAME, else inferctl-router
    service_name: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    #: share of new traces recorded (parent-based: a client's sampled trace is always continued);
    #: None: OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, else all
    sample_ratio: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_headers(cls, data: Any) -> Any:
        if isinstance(data, dict) and "headers" in data:
            raise ValueError("exporter headers are not read from the profile (they usually carry a secret): "
                             "export OTEL_EXPORTER_OTLP_HEADERS (or OTEL_EXPORTER_OTLP_TRACES_HEADERS) instead")
        return data
