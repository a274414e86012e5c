/** What the sidebar shows in its body: one view at a time, disposed when replaced. */
export interface View {
  readonly node: HTMLElement;
  /** Stop timers and pending requests of the view. */
  dispose(): void;
}
