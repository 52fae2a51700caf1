-- A model call is over: free its concurrency slot and count its actual tokens.
-- Mirrors `agent_runner.model_limits.settle_state`.
--
-- KEYS[1]  state key (RedisKeys.model_limit[0]): hash {rpm_tat, tpm_tat, paused_until}
-- KEYS[2]  calls key (RedisKeys.model_limit[1]): sorted set of reservation ids
-- ARGV[1]  reservation id
-- ARGV[2]  actual minus reserved tokens ('' to keep the reservation as it is)
-- ARGV[3]  tpm (0: not limited)
--
-- Returns 1.
--
-- Writes: KEYS[2] (ZREM), KEYS[1] (HSET tpm_tat). A state that expired meanwhile is left
-- absent: the call's tokens are then older than a minute and count for nothing.

redis.call('ZREM', KEYS[2], ARGV[1])
local tpm = tonumber(ARGV[3])
if ARGV[2] ~= '' and tpm > 0 then
    local tat = tonumber(redis.call('HGET', KEYS[1], 'tpm_tat'))
    if tat then
        redis.call('HSET', KEYS[1], 'tpm_tat', string.format('%.3f', tat + tonumber(ARGV[2]) * 60000 / tpm))
    end
end
return 1
