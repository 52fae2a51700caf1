-- Read who holds a turn's lease now.
--
-- KEYS[1]  lease key (RedisKeys.turn_lease): hash {owner, fence}
--
-- Returns {owner, fence} of the unexpired lease, or nil when it is free.
--
-- Writes: nothing.

local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if not held[1] then
    return false
end
return {held[1], held[2]}
