-- Read the active turn of a conversation.
--
-- KEYS[1]  active-turn key (RedisKeys.active_turn): string, the holder's turn id
--
-- Returns the holder's turn id, or nil when the conversation has none.
--
-- Writes: nothing.

return redis.call('GET', KEYS[1])
