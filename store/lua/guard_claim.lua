-- Mark a turn as the active turn of its conversation, unless another turn is marked.
--
-- KEYS[1]  active-turn key (RedisKeys.active_turn): string, the holder's turn id
-- ARGV[1]  turn id claiming the conversation
--
-- Returns the turn id that holds the conversation after the call: ARGV[1] when the
-- claim succeeded (or it already held it), the other holder otherwise.
--
-- Writes: KEYS[1] (SET) when it was empty.
--
-- The mark has no TTL: an active turn may wait days for a person. A holder that ended
-- without releasing is moved away with guard_replace.lua once the turn store confirms
-- it is terminal.

local holder = redis.call('GET', KEYS[1])
if holder then
    return holder
end

redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
