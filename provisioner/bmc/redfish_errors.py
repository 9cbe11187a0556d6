"""The ``redfish`` driver's error mapping: a BMC's answer (status, Redfish error body) and
aiohttp's exceptions to the driver errors (``provisioner.bmc.base``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp

from provisioner.bmc.base import BmcAuthFailed, BmcTimeout, BmcUnreachable, BmcUnsupported
from provisioner.errors import DriverError

JsonObject = dict[str, object]


def _message(data: JsonObject) -> object:
    error = data.get("error")
    if not isinstance(error, dict):
        return None
    return error.get("message") or error.get("@Message.ExtendedInfo")


def _check(status: int, data: JsonObject, url: str, what: str) -> None:
    if status < 400:
        return
    message = _message(data)
    detail = f"{what}: HTTP {status}" + (f": {message}" if message else "")
    if status in (401, 403):
        raise BmcAuthFailed(f"BMC {url}: {detail} (wrong user or password?)")
    if status in (408, 429) or status >= 500:
        raise BmcUnreachable(f"BMC {url}: {detail}")
    raise BmcUnsupported(f"BMC {url}: {detail}")


@contextmanager
def map_http_errors(url: str, what: str, timeout_s: float) -> Iterator[None]:
    """aiohttp's exceptions to ours, at the module boundary."""
    try:
        yield
    except DriverError:
        raise
    except TimeoutError:
        raise BmcTimeout(f"BMC {url}: no answer to {what} within {timeout_s:g} s") from None
    except aiohttp.ClientConnectorCertificateError as exc:
        raise BmcAuthFailed(f"BMC {url}: TLS certificate not trusted ({exc.certificate_error});"
                            " set bmc.redfish_ca_file, or bmc.redfish_verify_tls = false "
                            "in a lab") from exc
    except aiohttp.ContentTypeError as exc:
        raise BmcUnsupported(f"BMC {url}: {what}: not a Redfish answer ({exc.message})") \
            from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise BmcUnreachable(f"BMC {url}: {what}: {type(exc).__name__}: {exc}") from exc
