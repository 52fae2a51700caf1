// Keeping a view fresh: reload on demand (an event, a decision) and on a timer, never two
// loads at once, and a request that comes during a load runs one more load after it.

export class Refresher {
  /**
   * @param {() => Promise<void>} load Reloads the view.
   * @param {{intervalMs: number, onError: (error: Error) => void}} options How often to
   *   reload when nothing asks, and what to show when a load fails.
   */
  constructor(load, { intervalMs, onError }) {
    this.load = load;
    this.intervalMs = intervalMs;
    this.onError = onError;
    this.stopped = false;
    this.timer = null;
    this.running = null;
    this.again = false;
  }

  /** The first load; then `afterFirst` (unless stopped meanwhile) and the timer. */
  start(afterFirst = () => {}) {
    this.running = this.load()
      .catch((error) => this.onError(error))
      .finally(() => {
        this.running = null;
        if (this.stopped) return;
        afterFirst();
        this.timer = setTimeout(() => this.request(), this.intervalMs);
      });
  }

  /** Reload now, or right after the load under way. */
  request() {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    clearTimeout(this.timer);
    this.running = this.load()
      .catch((error) => {
        if (!this.stopped) this.onError(error);
      })
      .finally(() => {
        this.running = null;
        if (this.stopped) return;
        if (this.again) {
          this.again = false;
          this.request();
        } else {
          this.timer = setTimeout(() => this.request(), this.intervalMs);
        }
      });
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}
