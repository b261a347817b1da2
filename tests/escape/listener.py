"""A listener of the escape suite's outside hosts: accepts TCP and UDP on
ADDR:PORT and prints one line per peer, `ADDR tcp|udp PEER [PAYLOAD]`,
until terminated.

Usage: listener.py ADDR PORT
"""

import signal
import socket
import sys
import threading


def main() -> None:
    addr, port = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((addr, port))
    tcp.listen(64)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((addr, port))

    def udp_loop() -> None:
        while True:
            data, peer = udp.recvfrom(256)
            text = data.decode(errors="replace").split()[0] if data.strip() else "-"
            print(f"{addr} udp {peer[0]} {text}", flush=True)

    threading.Thread(target=udp_loop, daemon=True).start()
    while True:
        conn, peer = tcp.accept()
        # The readiness probe comes from the listener's own namespace.
        if peer[0] != addr:
            print(f"{addr} tcp {peer[0]}", flush=True)
        conn.close()


if __name__ == "__main__":
    main()
