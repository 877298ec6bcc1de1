-- One session of three turns, written by TokenHistory's list version (commit 458cd97) through
-- SessionStore.save_turn; its context digest was b1eb0fb194ab5c39e4a58677d8a30d90 (136 tokens).
-- tests/chat/test_history.py loads it with the array version. See tests/data/README.md.
BEGIN TRANSACTION;
CREATE TABLE alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO "alembic_version" VALUES('0010');
CREATE TABLE apscheduler_jobs (
	id VARCHAR(191) NOT NULL, 
	next_run_time FLOAT, 
	job_state BLOB NOT NULL, 
	PRIMARY KEY (id)
);
CREATE TABLE "cache_entries" (
	id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, 
	scope VARCHAR(64) NOT NULL, 
	"key" VARCHAR(64) NOT NULL, 
	question TEXT NOT NULL, 
	answer TEXT NOT NULL, 
	embedder VARCHAR(256) NOT NULL, 
	embedding BLOB NOT NULL, 
	hits INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	last_hit_at DATETIME, 
	cut_at INTEGER, 
	UNIQUE ("key")
);
CREATE TABLE chats (
	id VARCHAR(128) NOT NULL, 
	channel VARCHAR(32) NOT NULL, 
	chat_type VARCHAR(16) NOT NULL, 
	name VARCHAR(256), 
	system_prompt TEXT, 
	created_at DATETIME NOT NULL, 
	updated_at DATETIME NOT NULL, persona_name VARCHAR(64), persona_manner TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "chats" VALUES('legacy','api','p2p',NULL,NULL,'2026-12-01 06:53:09.689347','2026-12-01 06:53:09.689358',NULL,NULL);
CREATE TABLE followed_threads (
	root_message_id VARCHAR(128) NOT NULL, 
	expires_at DATETIME NOT NULL, 
	PRIMARY KEY (root_message_id)
);
CREATE TABLE memories (
	id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, 
	owner VARCHAR(256) NOT NULL, 
	text TEXT NOT NULL, 
	source VARCHAR(16) NOT NULL, 
	embedder VARCHAR(128) NOT NULL, 
	embedding BLOB NOT NULL, 
	created_at DATETIME NOT NULL
);
CREATE TABLE messages (
	id INTEGER NOT NULL, 
	session_id INTEGER NOT NULL, 
	seq INTEGER NOT NULL, 
	turn_index INTEGER NOT NULL, 
	role VARCHAR(16) NOT NULL, 
	text TEXT NOT NULL, 
	token_ids BLOB NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(session_id) REFERENCES sessions (id) ON DELETE CASCADE, 
	CONSTRAINT uq_messages_session_seq UNIQUE (session_id, seq)
);
INSERT INTO "messages" VALUES(1,1,0,0,'user','今天北京天气怎么样？适合出去跑步吗？',X'5C50020068030000C6000000248901007E0D01007397010018980100372C000087870100A98E01000AA40100AD8A0100372C00005D500200C6000000','2026-12-01 06:53:09.697018');
INSERT INTO "messages" VALUES(2,1,1,0,'assistant','北京今天晴，最高气温18度，适合户外跑步。',X'5C500200232D0100C6000000735002000F010000745002000F0100007E0D010024890100FC9A0100FD0E00003A960100CF9F010010000000170000000D670000FD0E000087870100559D01000AA40100ED0600005D500200C6000000','2026-12-01 06:53:09.697687');
INSERT INTO "messages" VALUES(3,1,2,1,'user','And in English? Use an emoji 😀 please.',X'5C50020068030000C6000000DC0B000030010000DC1800001E00000043150000CA0100007DA50000CC600100861100000D0000005D500200C6000000','2026-12-01 06:53:09.702787');
INSERT INTO "messages" VALUES(4,1,3,1,'assistant','Sunny, 18 °C: a good day for a run 🏃.',X'5C500200232D0100C6000000735002000F010000745002000F01000032000000A16A00000B000000DC0000001000000017000000BE8D00002200000019000000080100007D0600006B07000071010000080100003E0600009A2B0000ED000000E10000000D0000005D500200C6000000','2026-12-01 06:53:09.703102');
INSERT INTO "messages" VALUES(5,1,4,2,'user','```python
print(''x'')
```  what does this print?',X'5C50020068030000C60000007A1F01007D310000C600000046050000EC01000057000000190500007A1F0100DC0000006804000016060000A3010000950400001E0000005D500200C6000000','2026-12-01 06:53:09.705154');
INSERT INTO "messages" VALUES(6,1,5,2,'assistant','It prints `x` followed by a newline.',X'5C500200232D0100C6000000735002000F010000745002000F01000054080000B15B00001D060000570000003F000000AE1F00002902000008010000739800000D0000005D500200C6000000','2026-12-01 06:53:09.705465');
CREATE TABLE processed_events (
	"key" VARCHAR(256) NOT NULL, 
	created_at DATETIME NOT NULL, 
	expires_at DATETIME NOT NULL, chat_type VARCHAR(16), finished_at DATETIME, resumed_at DATETIME, 
	PRIMARY KEY ("key")
);
CREATE TABLE sessions (
	id INTEGER NOT NULL, 
	"key" VARCHAR(256) NOT NULL, 
	chat_id VARCHAR(128), 
	system_prompt TEXT, 
	state VARCHAR(16) NOT NULL, 
	created_at DATETIME NOT NULL, 
	last_active_at DATETIME NOT NULL, 
	closed_at DATETIME, context_seqs JSON, compacted_through_seq INTEGER, compressions INTEGER DEFAULT '0' NOT NULL, transcript_digest VARCHAR(32), distilled_at DATETIME, 
	PRIMARY KEY (id), 
	FOREIGN KEY(chat_id) REFERENCES chats (id) ON DELETE SET NULL
);
INSERT INTO "sessions" VALUES(1,'api:legacy','legacy','You are a test bot. 回答要简洁。','active','2026-12-01 06:53:09.692545','2026-12-01 06:53:09.705652',NULL,NULL,NULL,0,'ec454e9fbb9fcdedf7260a569c46d70b',NULL);
CREATE INDEX ix_processed_events_expires_at ON processed_events (expires_at);
CREATE INDEX ix_sessions_chat_id ON sessions (chat_id);
CREATE INDEX ix_sessions_key ON sessions ("key");
CREATE INDEX ix_sessions_last_active_at ON sessions (last_active_at);
CREATE UNIQUE INDEX uq_sessions_active_key ON sessions ("key") WHERE state = 'active';
CREATE INDEX ix_sessions_transcript_digest ON sessions (transcript_digest);
CREATE INDEX ix_followed_threads_expires_at ON followed_threads (expires_at);
CREATE INDEX ix_memories_owner ON memories (owner);
CREATE INDEX ix_apscheduler_jobs_next_run_time ON apscheduler_jobs (next_run_time);
CREATE INDEX ix_cache_entries_scope ON cache_entries (scope);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('cache_entries',0);
COMMIT;
