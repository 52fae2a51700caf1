-- Give a turn's lease up, only for the owner and fence that hold it now.
--
-- KEYS[1]  lease key (RedisKeys.turn_lease): hash {owner, fence}
-- ARGV[1]  owner token of the caller
-- ARGV[2]  fencing number of the caller's lease
--
-- Returns 1 when the lease was released, 0 when the caller no longer held it.
--
-- Writes: KEYS[1] (DEL). The fence counter is kept, so the next holder gets a higher fence.
--
-- Checking the fence, not only the owner, keeps a late release from an expired lease
-- from freeing the lease that the same owner has since acquired again.

local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if held[1] ~= ARGV[1] or tonumber(held[2]) ~= tonumber(ARGV[2]) then
    return 0
end

redis.call('DEL', KEYS[1])
return 1
