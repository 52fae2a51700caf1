-- The time a script decides at, in ms: ARGV's value when the caller walks its own clock (tests),
-- else the server's, which every process of a fleet shares.
-- A script takes it in with an include line, which store/_scripts.py expands.
local function now_ms(given)
    if given ~= '' then
        return tonumber(given)
    end
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
