-- Extend a turn's lease, only for the owner and fence that hold it now.
--
-- KEYS[1]  lease key (RedisKeys.turn_lease): hash {owner, fence}
-- ARGV[1]  owner token of the caller
-- ARGV[2]  fencing number of the caller's lease
-- ARGV[3]  new time to live in milliseconds, counted from now (a positive integer)
--
-- Returns 1 when the lease was extended, 0 when the caller no longer holds it.
--
-- Writes: KEYS[1] (PEXPIRE).
--
-- Both owner and fence must match: an owner that acquired the turn again holds a newer
-- fence, and its older Lease must not keep the new one alive. An expired lease is absent,
-- so a holder that paused past its TTL cannot revive it, even when nobody took it since.

local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if held[1] ~= ARGV[1] or tonumber(held[2]) ~= tonumber(ARGV[2]) then
    return 0
end

redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
