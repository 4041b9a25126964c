"""RecencyCache: a bounded map evicting the entry used least recently."""

from tracegrad.autograd.lru import RecencyCache


def test_a_stored_value_is_found_and_a_missing_key_gives_the_default():
    cache = RecencyCache(4)
    cache.put(("a", 1), None)
    assert cache.get(("a", 1), False) is None  # a stored None is a value, not a miss
    assert cache.get(("b", 2), False) is False


def test_insertion_past_capacity_evicts_the_least_recently_used_entry():
    cache = RecencyCache(2)
    cache.put("first", 1)
    cache.put("second", 2)
    assert cache.get("first") == 1  # now "second" is the least recently used
    cache.put("third", 3)
    assert "second" not in cache
    assert cache.get("first") == 1 and cache.get("third") == 3
    assert len(cache) == 2


def test_replacing_a_value_keeps_one_entry_and_pop_and_clear_remove():
    cache = RecencyCache(2)
    cache.put("key", 1)
    cache.put("key", 2)
    assert len(cache) == 1 and cache.get("key") == 2
    assert cache.pop("key") == 2 and cache.pop("key", "gone") == "gone"
    cache.put("other", 3)
    cache.clear()
    assert len(cache) == 0
