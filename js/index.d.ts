// Types of turnsafe-store. The Session types are the OpenAI Agents SDK's
// (`@openai/agents`, 0.20): a TurnsafeSession is a `Session` and a
// `SessionHistoryTransactionAwareSession`.
import type {
  AgentInputItem,
  Session,
  SessionHistoryTransactionArgs,
  SessionHistoryTransactionAwareSession,
} from '@openai/agents';

/** A divert receipt: made only after the copy's bytes, the file and its folders were fsynced. */
export interface DivertReceipt {
  /** Absolute path of `<home>/sessions/<session>.jsonl`. */
  path: string;
  offset: number;
  length: number;
  count: number;
  /** Hex sha256 of the bytes `[offset, offset + length)`. */
  sha256: string;
}

/** The user copy the policy built from the outcome. */
export interface UserCopy {
  code: string;
  cause: string;
  outcome: 'persisted' | 'diverted' | 'divert_failed' | 'handed_back';
  title: string;
  body: string;
  remediation: string[];
  details: Record<string, string>;
}

/** The outcome of one flush, exactly the object `turnsafe append` prints. */
export interface Outcome {
  persisted: boolean;
  operation: string | null;
  cause: string | null;
  action: string | null;
  attempts: number;
  committed: number;
  diverted: number;
  handed_back: number;
  receipt: DivertReceipt | null;
  copy: UserCopy | null;
  error: string | null;
  uids: string[];
  minted_uids: string[];
  divert_error: { operation: string; errno: number | null; error: string } | null;
  divert_residue: { path: string; offset: number } | null;
  capture:
    | { path: string; files: { name: string; size: number }[]; manifest_sha256: string }
    | { error: string; operation: string; errno: number | null }
    | null;
  pending_capture: { path: string; cause: string } | null;
  durable: boolean;
}

export interface TurnsafeSessionOptions {
  /** Name of this writer in the session's turn lease (default `pid-<pid>`). */
  holder?: string;
  /** How long the turn lease lasts without a write (default 30000). */
  leaseTtlMs?: number;
  /** `PRAGMA synchronous` (default `full`; `normal` commits are `durable: false`). */
  synchronous?: 'full' | 'normal';
  /**
   * Run the store in a worker thread (default true) or in the calling
   * thread (false), where the `...Sync` methods serve.
   */
  thread?: boolean;
  /** How long the worker polls for the next request after an answer before it sleeps, in ms (default 0.25; 0: never). */
  spinMs?: number;
  /** Run a clean batch on the component's typed flush machine (default true); false: every step through flush-step-json. */
  typedFlush?: boolean;
  /** The default `limit` of getItems. */
  limit?: number;
  /** A store to share (default: one per home and options in the process). */
  store?: Store;
}

/** A batch that was not committed: `outcome` says where every item is. */
export class TurnNotPersisted extends Error {
  name: 'TurnNotPersisted';
  outcome: Outcome;
  /** The outcome's JSON, byte for byte as the policy component wrote it. */
  outcomeText: string;
}

export class TurnsafeError extends Error {
  /** The policy's cause label, when there is one. */
  cause?: string;
  action?: string;
  edit?: string;
  attempts?: number;
  /** A clear whose divert lines could not be read or settled: the call that failed (`open`, `read`, `lock`, ...). */
  operation?: string;
  /** ... on this file or folder. */
  path?: string;
  errno?: number | null;
}

/** Refused before anything was written: a newer schema, an invalid session id. */
export class Refused extends TurnsafeError {
  name: 'Refused';
  found?: number;
  code?: string;
}

/** A read while an unsettled capture holds rows of the session that the database lacks. */
export class HistoryIncomplete extends TurnsafeError {
  name: 'HistoryIncomplete';
  /** The items that were read. */
  rows: AgentInputItem[];
  captures: { path: string; cause: string; rows: number | null }[];
}

export class Store {
  static for(home: string, options?: TurnsafeSessionOptions): Store;
  readonly home: string;
  close(): Promise<unknown>;
}

export class TurnsafeSession implements Session, SessionHistoryTransactionAwareSession {
  constructor(sessionId: string, home: string, options?: TurnsafeSessionOptions);
  readonly sessionId: string;
  /** The id the items are stored under (see safeSessionId). */
  readonly turnsafeId: string;
  readonly store: Store;
  getSessionId(): Promise<string>;
  getItems(limit?: number): Promise<AgentInputItem[]>;
  /** Rejects with TurnNotPersisted unless every item was committed. */
  addItems(items: AgentInputItem[]): Promise<void>;
  popItem(): Promise<AgentInputItem | undefined>;
  clearSession(): Promise<void>;
  replaceHistoryWithCompaction(items: AgentInputItem[]): Promise<void>;
  applyHistoryTransaction(args: SessionHistoryTransactionArgs): Promise<void>;
  /** Gives back the session's turn lease; the last session on a store closes it. */
  close(): Promise<void>;
  // The synchronous path: a session opened with `thread: false` only (else a TypeError).
  getItemsSync(limit?: number): AgentInputItem[];
  /** Throws TurnNotPersisted unless every item was committed. */
  addItemsSync(items: AgentInputItem[]): void;
  popItemSync(): AgentInputItem | undefined;
  clearSessionSync(): void;
  replaceHistoryWithCompactionSync(items: AgentInputItem[]): void;
  applyHistoryTransactionSync(args: SessionHistoryTransactionArgs): void;
  closeSync(): void;
}

/** The id a session is stored under: a valid turnsafe id as it is, any other string hashed. */
export function safeSessionId(sessionId: string): string;

/** The `state.db` schema version this package writes (and the newest it opens). */
export const SCHEMA_VERSION: number;
