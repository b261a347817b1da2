"""Web server of the test's "internet" namespace: on one address, plain
HTTP on ports 8080 and 80 and HTTPS on 443 (a self-signed certificate),
all serving one directory (whose `who` file names the address).

Usage: inet_server.py ADDR DIR CERT KEY
"""

import functools
import http.server
import ssl
import sys
import threading


def main() -> None:
    addr, directory, cert, key = sys.argv[1:5]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
    for port, tls in ((8080, False), (80, False), (443, True)):
        server = http.server.ThreadingHTTPServer((addr, port), handler)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
