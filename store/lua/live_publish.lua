-- Append a batch of live events to their streams, then restart each stream's retention.
--
-- KEYS       the event streams of the batch, each once (RedisKeys.turn_events,
--            RedisKeys.conversation_events)
-- ARGV[1]    about how many entries each stream keeps (XADD MAXLEN ~, a positive integer)
-- ARGV[2]    retention in milliseconds, counted from now (a positive integer)
-- ARGV[3..]  one pair per entry, in the order to append: the position in KEYS of its
--            stream (1-based), then the entry's `event` field (the event's JSON)
--
-- Returns {appended, failed, the first failure's message or ''}.
--
-- Writes: every key of KEYS (XADD, PEXPIRE).
--
-- One call carries what a pipeline of an XADD per entry and a PEXPIRE per stream did, at a
-- fraction of the client's work per event. As in that pipeline, an entry Redis refuses (a
-- key of another type under a stream's name) does not stop the others.

local maxlen, retention = ARGV[1], ARGV[2]
local appended, failed, first = 0, 0, ''

for i = 3, #ARGV, 2 do
    local reply = redis.pcall('XADD', KEYS[tonumber(ARGV[i])], 'MAXLEN', '~', maxlen, '*', 'event', ARGV[i + 1])
    if type(reply) == 'table' and reply.err then
        failed = failed + 1
        if first == '' then
            first = reply.err
        end
    else
        appended = appended + 1
    end
end

for i = 1, #KEYS do
    redis.call('PEXPIRE', KEYS[i], retention)
end

return {appended, failed, first}
