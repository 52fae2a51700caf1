#!/usr/bin/env bash
# Start the local services the integration tests need, when they are not running.
# On a laptop with Docker, `docker compose -f deploy/compose.yaml up -d postgres redis` does the same.
set -u
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null 2>&1; then
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi
fi
if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  fi
fi
# RabbitMQ is only needed by the tests that run Celery on the AMQP broker.
if command -v rabbitmqctl >/dev/null 2>&1 && ! rabbitmqctl status >/dev/null 2>&1; then
  rabbitmq-server -detached >/dev/null 2>&1
  timeout 60 rabbitmqctl await_startup >/dev/null 2>&1 || echo "warning: RabbitMQ did not start" >&2
fi
for _ in $(seq 1 30); do
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "warning: PostgreSQL or Redis is still not reachable; integration tests will fail" >&2
exit 0
