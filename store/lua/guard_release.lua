-- Clear a conversation's active-turn mark, only for the turn that holds it.
--
-- KEYS[1]  active-turn key (RedisKeys.active_turn): string, the holder's turn id
-- ARGV[1]  turn id giving the mark up
--
-- Returns 1 when the mark was cleared, 0 when ARGV[1] did not hold it.
--
-- Writes: KEYS[1] (DEL) on success.
--
-- A late release from a turn whose mark was already replaced must not free the
-- conversation under its new active turn.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end

redis.call('DEL', KEYS[1])
return 1
