-- Move a conversation's active-turn mark from an expected holder to a new turn.
--
-- KEYS[1]  active-turn key (RedisKeys.active_turn): string, the holder's turn id
-- ARGV[1]  turn id expected to hold the mark (the caller checked it is terminal)
-- ARGV[2]  turn id to mark active instead
--
-- Returns 1 when the mark moved, 0 when ARGV[1] was not the holder (including when
-- there was no holder: the caller should claim instead).
--
-- Writes: KEYS[1] (SET) on success.
--
-- A compare-and-set: of two callers replacing the same terminal holder, only the first
-- moves the mark; the second sees the new holder and must not overwrite it.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end

redis.call('SET', KEYS[1], ARGV[2])
return 1
