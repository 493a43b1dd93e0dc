"""The decode replica room: the replica actor (:mod:`.decode`), what it has taken and
must report (:mod:`.book`), and the lock-step step barrier (:mod:`.barrier`)."""
