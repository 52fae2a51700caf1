-- Pause a model limit for every process until a time (a provider's 429 with Retry-After).
-- Mirrors `agent_runner.model_limits.pause_state`.
--
-- KEYS[1]  state key (RedisKeys.model_limit[0]): hash {rpm_tat, tpm_tat, paused_until}
-- ARGV[1]  how long to pause, in ms (a duration, so the caller's clock need not match the server's)
-- ARGV[2]  rpm (0: not limited), ARGV[3] burst
-- ARGV[4]  ms to keep the state after the pause ends (a minute plus the call lease and grace)
-- ARGV[5]  now in ms ('' for the server clock)
--
-- Returns 1.
--
-- Writes: KEYS[1] (HSET paused_until, rpm_tat; PEXPIRE from the furthest time it holds). The request rate restarts at the
-- end of the pause, so the calls that waited for it are spread out again instead of
-- arriving together.

-- include: _clock
local now = now_ms(ARGV[5])
local until_ms = now + tonumber(ARGV[1])
local rpm, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local paused = tonumber(redis.call('HGET', KEYS[1], 'paused_until')) or 0
if until_ms > paused then
    paused = until_ms
    redis.call('HSET', KEYS[1], 'paused_until', string.format('%.3f', paused))
end
local furthest = math.max(paused, tonumber(redis.call('HGET', KEYS[1], 'tpm_tat')) or 0)
if rpm > 0 then
    local tat = tonumber(redis.call('HGET', KEYS[1], 'rpm_tat')) or 0
    local floor = until_ms + (burst - 1) * 60000 / rpm
    if floor > tat then
        tat = floor
        redis.call('HSET', KEYS[1], 'rpm_tat', string.format('%.3f', tat))
    end
    furthest = math.max(furthest, tat)
end
-- Never shortens the life the acquire script gave the state: it counts from the furthest time held.
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(furthest - now, 0) + tonumber(ARGV[4])))
return 1
