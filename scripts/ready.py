"""What `scripts/run` says once mitmproxy listens: where each listener is, where
mitmproxy's CA is and what a client needs, and what to do next.  A mitmproxy
script that scripts/run loads beside the addon; it changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os

from mitmproxy import ctx
from mitmproxy.proxy import mode_specs

logger = logging.getLogger(__name__)
WAIT_S = 30  # for every listener to be up (mitmproxy starts them after the `running` hook)


def listener_lines(ca: str) -> list[str]:
    servers = list(ctx.master.addons.get("proxyserver").servers)
    lines = []
    for server in servers:
        addrs = sorted({f"{host}:{port}" for host, port, *_ in server.listen_addrs})
        if not addrs:
            continue
        where = addrs[0].replace("0.0.0.0:", "127.0.0.1:").replace("[::]:", "127.0.0.1:").replace("::", "127.0.0.1")
        mode = server.mode
        if isinstance(mode, mode_specs.RegularMode):
            lines += [f"  Proxy mode at {where}: give a client HTTPS_PROXY=http://{where} and make it trust",
                      f"    mitmproxy's CA, {ca}",
                      "    (SSL_CERT_FILE for Python clients, curl --cacert, NODE_EXTRA_CA_CERTS for Node.js",
                      "    ones such as Claude Code). A client that does not trust it fails its TLS handshakes:",
                      "    the log fills with 'Client TLS handshake failed. The client does not trust the",
                      "    proxy's certificate' while the client retries quietly (docs/clients.md#trusting-mitmproxys-ca)."]
        elif isinstance(mode, mode_specs.ReverseMode):
            target = f"{mode.scheme}://{mode.address[0]}" + (f":{mode.address[1]}" if mode.address[1] not in (80, 443)
                                                            else "")
            host = mode.address[0]
            path = "/v1" if host.endswith("openai.com") else ""
            hint = "no CA needed" if path or host.endswith(("anthropic.com", "googleapis.com")) \
                else "+ /v1 for OpenAI-style clients; no CA needed"
            lines += [f"  Reverse mode at {where} for {target}: give a client the base URL http://{where}{path}",
                      f"    ({hint})."]
        else:
            lines += [f"  {mode.description} at {where}: clients there must trust mitmproxy's CA, {ca}"]
    return lines


async def announce() -> None:
    expected = len(ctx.options.mode)
    proxyserver = ctx.master.addons.get("proxyserver")
    for _ in range(WAIT_S * 10):  # bounded: listeners come up within a second or so
        running = [s for s in proxyserver.servers if s.is_running]
        if len(running) >= expected:
            break
        await asyncio.sleep(0.1)
    ca = os.path.join(os.path.expanduser(ctx.options.confdir), "mitmproxy-ca-cert.pem")
    logger.info("\n".join([
        "Switchyard is ready.",
        *listener_lines(ca),
        "  Next: a recipe for your client (openai, anthropic, google-genai, curl, llm, Codex, Claude Code,",
        "  Gemini CLI) is in docs/clients.md; scripts/try puts a provider that fails on purpose behind",
        "  Switchyard, to see your client survive it; " + ("mitmweb shows what failed and why."
                                                          if ctx.master.addons.get("webaddon") is not None
                                                          else "scripts/run --web shows what failed and why."),
    ]))


class Ready:
    def running(self) -> None:
        asyncio.get_running_loop().create_task(announce())


addons = [Ready()]
