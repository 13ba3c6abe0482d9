"""Transport: sockets and HTTP/1.1. One protocol per socket (channel), coroutines stepped from
socket callbacks (fiber), request heads, bodies and their limits (http), pooled upstream
connections and one exchange (upstream), deadlines (watchdog), the OpenAI-shaped error bodies
(errors). Imports nothing above it."""
